"""Each health rule against hand-built step sequences: it fires at the step the rule says, and not
on a healthy run's noise (a recorded quickstart, seeded random noise)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from healthy_quickstart import ENTROPY, GRAD_NORM, KL, LENGTH, TRUNCATED

from telescope.core.config import load_config
from telescope.core.health.rules import Observation, RewardSaturation, StepRule, step_rules
from telescope.core.health.signals import StepSignals
from telescope.core.health.stats import History


def config(**fields: Any) -> Any:
    return load_config(None, {"environments": [{"name": "reverse_text"}], **fields})


def rule(name: str, **fields: Any) -> StepRule:
    (found,) = [r for r in step_rules(config(**fields)) if r.name == name]
    return found


def healthy(step: int) -> StepSignals:
    """Step ``step`` (1-based) of the recorded healthy quickstart."""
    i = step - 1
    return StepSignals(step, ENTROPY[i], KL[i], GRAD_NORM[i], LENGTH[i], TRUNCATED[i], 0.0625)


def run(r: StepRule, steps: list[StepSignals]) -> list[Observation]:
    return [r.observe(s) for s in steps]


def raised_at(r: StepRule, steps: list[StepSignals]) -> list[int]:
    return [s.step for s, seen in zip(steps, run(r, steps), strict=True) if seen.raised]


def then(signals: list[StepSignals], **fields: list[Any]) -> list[StepSignals]:
    """``signals`` followed by steps that copy the last one with ``fields`` replaced, one per value."""
    n = len(next(iter(fields.values())))
    last = signals[-1]
    extra = [replace(last, step=last.step + 1 + k, **{f: v[k] for f, v in fields.items()}) for k in range(n)]
    return signals + extra


QUICKSTART = [healthy(s) for s in range(1, 41)]


def test_history_median_and_mad_by_hand() -> None:
    history = History(5)
    for step, value in enumerate([7.0, 1.0, 2.0, 3.0, 4.0, 100.0], start=1):
        history.add(step, value)  # 7.0 (step 1) falls out of the window of 5
    base = history.baseline()
    assert base is not None
    # values 1 2 3 4 100: median 3; |v - 3| = 2 1 0 1 97 -> MAD 1
    assert (base.median, base.sigma, base.first_step, base.last_step) == (3.0, 1.4826, 2, 6)
    history.drop_after(4)
    assert history.baseline() == replace(base, median=2.0, sigma=1.4826, last_step=4, count=3)


def test_a_first_only_history_keeps_the_runs_start() -> None:
    start = History(3, first_only=True)
    for step, value in enumerate([0.1, 0.2, 0.3, 0.9, 0.9, 0.9], start=1):
        start.add(step, value)
    base = start.baseline()
    assert base is not None and (base.median, base.first_step, base.last_step) == (0.2, 1, 3)


def test_length_blowup_a_slow_creep_is_measured_from_the_start() -> None:
    """10 steps at 10% truncated, then +4 points a step: the run's start (10%) puts the line at 55%,
    first passed at step 22 (58%); against the last 10 steps' median it would keep moving away."""
    shares = [0.1] * 10 + [0.1 + 0.04 * k for k in range(1, 21)]
    steps = [StepSignals(s + 1, completion_tokens=20.0, truncated_share=t) for s, t in enumerate(shares)]
    assert raised_at(rule("length_blowup"), steps) == [23]


@pytest.mark.parametrize(
    "name", ["entropy_collapse", "kl_spike", "grad_norm_spike", "length_blowup", "length_collapse"]
)
def test_the_healthy_quickstart_raises_nothing(name: str) -> None:
    observations = run(rule(name), QUICKSTART)
    assert not any(o.raised for o in observations)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_trending_signals_raise_nothing(seed: int) -> None:
    """200 steps of +-30% noise around slow trends (entropy halves, length grows 50%)."""
    rng = random.Random(seed)
    steps = [
        StepSignals(
            s,
            entropy=2.0 * (1 - s / 400) * rng.uniform(0.7, 1.3),
            kl=0.01 * rng.uniform(0.7, 1.3),
            grad_norm=3.0 * rng.uniform(0.7, 1.3),
            completion_tokens=100 * (1 + s / 400) * rng.uniform(0.7, 1.3),
            truncated_share=0.05 * rng.uniform(0, 2),
            mode_share=0.1 * rng.uniform(0.5, 1.5),
        )
        for s in range(1, 201)
    ]
    for r in step_rules(config()):
        assert raised_at(r, steps) == [], r.name


def test_entropy_collapse_fires_on_the_second_step_below_a_quarter_of_the_median() -> None:
    steps = then(QUICKSTART[:10], entropy=[0.3, 0.2, 0.1])
    r = rule("entropy_collapse")
    seen = run(r, steps)
    # median of steps 1-10 = (2.235 + 2.123) / 2 = 2.179; 0.3 < 0.25 x 2.179 = 0.545
    assert [o.anomalous for o in seen[10:]] == [True, True, True]
    assert raised_at(rule("entropy_collapse"), steps) == [12]
    assert seen[11].onset == 11 and "median 2.18 over steps 1-10" in seen[11].evidence


def test_entropy_collapse_one_low_step_is_not_a_finding_and_does_not_enter_the_history() -> None:
    r = rule("entropy_collapse")
    steps = then(QUICKSTART[:10], entropy=[0.3, 2.0, 0.3, 2.0])
    assert [o.anomalous for o in run(r, steps)[10:]] == [True, False, True, False]
    assert not any(o.raised for o in run(rule("entropy_collapse"), steps))
    assert 0.3 not in [v for _, v in r.histories["entropy"]._values]


def test_entropy_collapse_ratio_is_the_config_field() -> None:
    steps = then(QUICKSTART[:10], entropy=[1.0, 1.0])  # 1.0 / 2.179 = 0.46 of the median
    assert raised_at(rule("entropy_collapse"), steps) == []
    assert raised_at(rule("entropy_collapse", health_entropy_collapse_ratio=0.5), steps) == [12]


def test_kl_spike_needs_both_the_spread_and_the_floor() -> None:
    steps = then(QUICKSTART[:20], kl=[0.3, 0.3, 2.0, 2.5])
    # 0.3 is far above median + 10 x spread of steps 11-20 (~0.01) but below health_kl_spike_min 0.5
    assert raised_at(rule("kl_spike"), steps) == [24]
    assert raised_at(rule("kl_spike", health_kl_spike_min=0.2), steps) == [22]


def test_kl_spike_limit_by_hand() -> None:
    r = rule(
        "kl_spike",
        health_kl_spike_min=0.0,
        health_kl_spike_max=100.0,
        health_window_steps=5,
        health_min_history_steps=5,
    )
    steps = [StepSignals(s, kl=v) for s, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0], start=1)]
    run(r, steps)
    # median 3, MAD 1 -> sigma 1.4826 (> 10% of 3); limit = 3 + 10 x 1.4826 = 17.826
    assert r.observe(StepSignals(6, kl=17.9)).anomalous  # an anomaly stays out of the history
    assert not r.observe(StepSignals(7, kl=17.8)).anomalous


def test_kl_spike_a_kl_that_creeps_past_the_ceiling() -> None:
    """Recorded: the quickstart's learning rate warmed up to 100x over 50 steps; each step's KL is
    within the spread of the ones before, but from step 8 it is above 1 nat per token."""
    kl = [4e-09, 0.162, 0.522, 0.428, 0.393, 0.523, 0.607, 1.143, 0.916, 1.033, 0.713, 0.815, 2.709, 1.421]
    steps = [StepSignals(s + 1, kl=v) for s, v in enumerate(kl)]
    assert raised_at(rule("kl_spike", health_kl_spike_max=100.0), steps) == []
    assert raised_at(rule("kl_spike"), steps) == [14]  # 2.71 and 1.42 in a row (onset 13)
    assert raised_at(rule("kl_spike", health_kl_spike_max=0.5), steps) == [7]


def test_the_window_starts_at_the_first_anomaly_of_the_episode_not_the_last_streak() -> None:
    """As in a measured rollback run (health_kl_spike_max 0.5): KL crossed 0.5 at step 6, dipped to 0.375
    at step 7, crossed again at steps 8-9. One healthy step does not end the episode (patience 2
    would be needed): raised at step 9 with onset 6."""
    kl = [4e-09, 0.16, 0.42, 0.43, 0.39, 0.52, 0.375, 0.6, 0.7]
    steps = [StepSignals(s + 1, kl=v) for s, v in enumerate(kl)]
    seen = run(rule("kl_spike", health_kl_spike_max=0.5), steps)
    assert [o.anomalous for o in seen] == [False] * 5 + [True, False, True, True]
    assert [(o.onset, o.raised) for o in seen[7:]] == [(6, False), (6, True)]
    # measured in another: 0.522 at step 3, then two healthy steps end that episode; 6-7 is a new one
    kl = [4e-09, 0.162, 0.522, 0.428, 0.393, 0.521, 0.508]
    seen = run(
        rule("kl_spike", health_kl_spike_max=0.5), [StepSignals(s + 1, kl=v) for s, v in enumerate(kl)]
    )
    assert [(o.anomalous, o.onset, o.raised) for o in seen[5:]] == [(True, 6, False), (True, 6, True)]


def test_grad_norm_spike_one_spike_is_noise_two_are_a_finding() -> None:
    assert raised_at(rule("grad_norm_spike"), QUICKSTART) == []  # step 8: 9.9, once
    steps = then(QUICKSTART[:20], grad_norm=[40.0, 60.0])
    assert raised_at(rule("grad_norm_spike"), steps) == [22]
    assert raised_at(rule("grad_norm_spike", health_patience_steps=1), QUICKSTART) == [8]


def test_length_blowup_by_ratio_and_by_truncation() -> None:
    assert raised_at(rule("length_blowup"), then(QUICKSTART[:20], completion_tokens=[25.0, 26.0])) == [22]
    # 11 tokens median over steps 11-20: 20 is below 2x, but 60% of completions hit the limit
    # when the median share was ~4%
    steps = then(QUICKSTART[:20], completion_tokens=[20.0, 20.0], truncated_share=[0.6, 0.7])
    assert raised_at(rule("length_blowup"), steps) == [22]
    assert raised_at(rule("length_blowup", health_length_blowup_truncated_share=0.8), steps) == []


def test_length_blowup_truncation_is_not_news_when_the_run_always_truncated() -> None:
    steps = [replace(s, truncated_share=0.6) for s in QUICKSTART[:20]]
    steps = then(steps, completion_tokens=[20.0, 20.0], truncated_share=[0.7, 0.7])
    assert raised_at(rule("length_blowup"), steps) == []


def test_length_blowup_a_creeping_length_exploit() -> None:
    """Recorded: reverse_text_lengthy (tests/health/faulty_envs.py) pays for length from step 1, so no
    step jumps against the one before; the share truncated at max_tokens leaves where it started."""
    truncated = [0.23, 0.33, 0.45, 0.41, 0.61, 0.55, 0.83, 0.88, 0.93, 0.94, 0.94, 0.98]
    lengths = [14.0, 15.4, 18.3, 17.6, 19.9, 19.0, 22.5, 22.6, 23.2, 23.6, 23.4, 23.9]
    steps = [
        StepSignals(s + 1, completion_tokens=n, truncated_share=t)
        for s, (n, t) in enumerate(zip(lengths, truncated, strict=True))
    ]
    seen = run(rule("length_blowup"), steps)
    # steps 1-6 start the run at a median of 0.43; step 7's 0.83 is past halfway to 1 (0.715)
    assert [s.step for s, o in zip(steps, seen, strict=True) if o.raised] == [8]
    assert "median 43% over the run's first healthy steps 1-6" in seen[7].evidence


def test_length_collapse() -> None:
    steps = then(QUICKSTART[:20], completion_tokens=[3.0, 1.0])
    assert raised_at(rule("length_collapse"), steps) == [22]
    assert raised_at(rule("length_collapse"), then(QUICKSTART[:20], completion_tokens=[5.0, 5.0])) == []


def test_degenerate_outputs_against_the_runs_own_level() -> None:
    steps = then(QUICKSTART[:10], mode_share=[0.9, 1.0])
    assert raised_at(rule("degenerate_outputs"), steps) == [12]
    always = [replace(s, mode_share=0.8) for s in QUICKSTART[:10]]  # a task with one common answer
    assert raised_at(rule("degenerate_outputs"), then(always, mode_share=[0.9, 1.0])) == []


def test_nonfinite_fires_at_once_and_again_after_a_finite_step() -> None:
    steps = then(QUICKSTART[:3], nonfinite=[("loss", "grad_norm"), (), ("train/skipped_nonfinite_steps",)])
    seen = run(rule("nonfinite"), steps)
    assert [s.step for s, o in zip(steps, seen, strict=True) if o.raised] == [4, 6]
    assert seen[3].evidence == "non-finite loss, grad_norm"


def test_steps_before_min_history_are_not_judged() -> None:
    steps = [StepSignals(1, entropy=2.0), StepSignals(2, entropy=0.01), StepSignals(3, entropy=0.01)]
    assert raised_at(rule("entropy_collapse", health_min_history_steps=1), steps) == [3]
    assert raised_at(rule("entropy_collapse", health_min_history_steps=2), steps) == []


def test_a_missing_signal_skips_the_step() -> None:
    r = rule("entropy_collapse")
    run(r, QUICKSTART[:10])
    assert r.observe(StepSignals(11, entropy=None)) == Observation(False)
    assert len(r.histories["entropy"]) == 10


def test_rewind_forgets_the_abandoned_steps() -> None:
    r = rule("entropy_collapse")
    run(r, then(QUICKSTART[:12], entropy=[0.1]))
    r.rewind(5)  # the window held steps 3-12 (13 was anomalous: not in it)
    assert [s for s, _ in r.histories["entropy"]._values] == [3, 4, 5]
    assert not r.observe(replace(QUICKSTART[5], entropy=0.1)).raised  # the streak starts over


def test_off_turns_a_rule_off() -> None:
    names = {r.name for r in step_rules(config(health_kl_spike_action="off"))}
    assert "kl_spike" not in names and "entropy_collapse" in names


def saturation_run(rewards: list[list[float]], groups: int = 64, share: float = 0.95) -> list[Observation]:
    rule = RewardSaturation(groups, share)
    return [rule.observe(r, step=1 + i // 16) for i, r in enumerate(rewards)]


def test_reward_saturated_when_the_window_is_nearly_all_flat() -> None:
    mixed, flat = [0.0, 1.0, 0.5, 1.0], [1.0, 1.0, 1.0, 1.0]
    seen = saturation_run([mixed] * 64 + [flat] * 70)
    # 61 of the last 64 is the first share >= 0.95 (60 / 64 = 0.9375, 61 / 64 = 0.953)
    first = next(i for i, o in enumerate(seen) if o.raised)
    assert first == 64 + 60 and sum(o.raised for o in seen) == 1
    assert seen[-1].anomalous and "95% of the last 64" in seen[first].evidence


def test_reward_saturated_not_on_a_run_with_some_signal() -> None:
    rng = random.Random(0)
    # 80% of groups flat (easy prompts at the plateau), the rest not: still a signal
    groups = [[1.0] * 8 if rng.random() < 0.8 else [1.0] * 7 + [0.0] for _ in range(500)]
    assert not any(o.anomalous for o in saturation_run(groups))
    assert not any(o.anomalous for o in saturation_run([[0.5]] * 100))  # one sample a group: no verdict


def test_reward_saturated_floats_compare_with_tolerance() -> None:
    flat = [0.1 + 0.2, 0.3, 0.3, 0.3]
    assert math.isclose(flat[0], 0.3) and flat[0] != 0.3
    assert saturation_run([flat] * 64)[-1].raised
