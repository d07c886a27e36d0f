"""The sentinel on the run hooks: what a finding reports (console line, metrics, timeline, run.json
info), how stop and rollback end a session, the degenerate-output signal of real rollout records,
and the driver's side of a rollback (restart point, later checkpoints set aside, lower LR)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pluggy
import pytest
from healthy_quickstart import ENTROPY, GRAD_NORM, KL

from telescope.core import hookimpl, hookspecs
from telescope.core.checkpoint import CheckpointManager
from telescope.core.config import ConfigError, load_config
from telescope.core.health import FINDINGS, HEALTH_PLUGIN
from telescope.core.health.findings import HealthRollback, HealthStop
from telescope.core.health.sentinel import HealthSentinel
from telescope.core.health.signals import mode_share, step_signals
from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent
from telescope.core.rollouts.groups import RolloutGroup, RolloutSample
from telescope.core.runtime.supervision.rollback import health_rollback


def config(tmp_path: Path, **fields: Any) -> Any:
    base = {"environments": [{"name": "reverse_text"}], "run_dir": str(tmp_path / "run")}
    return load_config(None, {**base, **fields})


class Recorder:
    """A plugin that keeps what reaches the run hooks (registered last: called first unless tryfirst)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.events: list[TimelineEvent] = []
        self.info: dict[str, Any] = {}
        self.logged: list[dict[str, float]] = []

    @hookimpl
    def telescope_warning(self, message: str) -> None:
        self.warnings.append(message)

    @hookimpl
    def telescope_events(self, events: list[TimelineEvent]) -> None:
        self.events.extend(events)

    @hookimpl
    def telescope_run_info(self, info: dict[str, Any]) -> None:
        self.info.update(info)

    @hookimpl
    def telescope_step_end(self, step: int, metrics: dict[str, float], rollouts: list[RolloutRecord]) -> None:
        self.logged.append(dict(metrics))


def plugged(cfg: Any) -> tuple[HealthSentinel, Recorder, pluggy.PluginManager, list[BaseException]]:
    pm = pluggy.PluginManager("telescope")
    pm.add_hookspecs(hookspecs)
    failures: list[BaseException] = []
    sentinel = HealthSentinel(cfg, pm.hook, fail=failures.append)
    recorder = Recorder()
    pm.register(sentinel, name=HEALTH_PLUGIN)
    pm.register(recorder, name="recorder")
    return sentinel, recorder, pm, failures


def metrics(step: int, **over: float) -> dict[str, float]:
    i = step - 1
    return {
        "entropy": ENTROPY[i],
        "kl_divergence_inference": KL[i],
        "grad_norm": GRAD_NORM[i],
        "loss": -0.5,
        **over,
    }


def feed(pm: pluggy.PluginManager, steps: list[dict[str, float]], first: int = 1) -> None:
    for k, m in enumerate(steps):
        pm.hook.telescope_step_end(step=first + k, metrics=m, rollouts=[])


def collapse_run() -> list[dict[str, float]]:
    """10 healthy quickstart steps, entropy 0.2 for steps 11-12, then healthy again at step 13."""
    return [metrics(s) for s in range(1, 11)] + [metrics(s, entropy=0.2) for s in (11, 12)] + [metrics(13)]


def test_warn_reports_once_and_marks_the_steps_it_lasts(tmp_path: Path) -> None:
    sentinel, recorder, pm, failures = plugged(config(tmp_path))
    feed(pm, collapse_run())
    (line,) = recorder.warnings
    assert line.startswith(
        "health: entropy_collapse at step 12 (anomalous since step 11): entropy 0.2 is below"
    )
    assert line.endswith("(health_entropy_collapse_action: warn)")
    # the loggers (recorder: registered after the sentinel) see the step's health/* metrics
    assert [m["health/entropy_collapse"] for m in recorder.logged[9:]] == [0.0, 0.0, 1.0, 0.0]
    assert {f"health/{name}" for name in FINDINGS} <= set(recorder.logged[0])
    assert recorder.logged[-1]["health/findings"] == 1.0
    (event,) = recorder.events
    assert (event.type, event.phase, event.name, event.step) == (
        "run",
        "instant",
        "health/entropy_collapse",
        12,
    )
    health = recorder.info["health"]
    assert health["state"] == "warning" and health["count"] == 1 and health["rollbacks"] == 0
    assert health["findings"][0]["name"] == "entropy_collapse" and health["findings"][0]["onset"] == 11
    assert sentinel.pending is None and not failures


def test_an_off_finding_has_no_metric(tmp_path: Path) -> None:
    _, recorder, pm, _ = plugged(config(tmp_path, health_entropy_collapse_action="off"))
    feed(pm, collapse_run())
    assert "health/entropy_collapse" not in recorder.logged[0] and not recorder.warnings


def test_stop_is_left_for_the_step_hook_and_ends_with_one_line(tmp_path: Path) -> None:
    sentinel, recorder, pm, _ = plugged(config(tmp_path, health_entropy_collapse_action="stop"))
    feed(pm, collapse_run()[:12])
    finding = sentinel.take_pending()
    assert finding is not None and finding.step == 12
    assert recorder.warnings[0].endswith("(health_entropy_collapse_action: stop; stopping the run)")
    error = sentinel.stop(finding, "checkpoint: /ckpt/step_12")
    assert isinstance(error, HealthStop)
    message = str(error)
    assert "\n" not in message and message.startswith("health: entropy_collapse at step 12")
    assert message.endswith(
        "the run stopped (health_entropy_collapse_action: stop); checkpoint: /ckpt/step_12"
    )
    assert recorder.info["health"]["state"] == "stopped"


def save_checkpoints(cfg: Any, steps: list[int]) -> CheckpointManager:
    mgr = CheckpointManager(Path(cfg.resolved_run_dir) / "checkpoints")
    for step in steps:
        partial = mgr.begin(step)
        (partial / "orchestrator_state.json").write_text('{"counts": {}, "prompts": {}}')
        mgr.commit(partial, step)
    return mgr


def test_rollback_picks_the_newest_checkpoint_older_than_the_window(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        health_entropy_collapse_action="rollback",
        checkpoint_every=3,
        learning_rate=0.01,
        max_async_rollout=0,
    )
    save_checkpoints(cfg, [3, 6, 9, 12])
    sentinel, recorder, pm, _ = plugged(cfg)
    feed(pm, collapse_run()[:12])
    finding = sentinel.take_pending()
    assert finding is not None and finding.onset == 11
    # step 11's entropy measured the weights of step 10 (synchronous): the checkpoint must be older, <= 9
    assert sentinel.rollback_target(finding) == (9, "")
    assert recorder.warnings[0].endswith("(health_entropy_collapse_action: rollback; rolling back to step 9)")
    error = sentinel.rollback(finding, 9)
    assert isinstance(error, HealthRollback) and (error.step, error.learning_rate) == (9, 0.005)
    assert "learning_rate 0.01 -> 0.005 (rollback 1 of health_max_rollbacks 2)" in str(error)
    assert recorder.info["health"]["state"] == "rolled_back" and recorder.info["health"]["rollbacks"] == 1
    # the re-run steps are judged against the history up to step 9 only, and can raise it again
    assert all(s <= 9 for rule in sentinel.rules for h in rule.histories.values() for s, _ in h._values)
    feed(pm, [metrics(10), metrics(11, entropy=0.2), metrics(12, entropy=0.2)], first=10)
    again = sentinel.take_pending()
    assert again is not None and again.step == 12 and len(recorder.warnings) == 2


def kl_rollback_config(tmp_path: Path) -> Any:
    """kl_spike rolls back over 0.5, a checkpoint every step (steps 1-11 saved), one step of async."""
    cfg = config(
        tmp_path,
        health_kl_spike_action="rollback",
        health_kl_spike_max=0.5,
        checkpoint_every=1,
        max_async_rollout=1,
    )
    save_checkpoints(cfg, list(range(1, 12)))
    return cfg


def test_rollback_restores_a_checkpoint_from_before_the_first_anomaly(tmp_path: Path) -> None:
    """KL over health_kl_spike_max at step 6, back under it at 7, over again at 8-9: raised at 9, the
    window starts at step 6. Step 6's rollouts were sampled with weights of step 4 or 5
    (max_async_rollout 1), its trainer held step 5's: the checkpoint must be older, <= 3 (not 5 or 6,
    after the damage, as the last streak's onset 8 would give)."""
    cfg = kl_rollback_config(tmp_path)
    sentinel, recorder, pm, _ = plugged(cfg)
    kl = [4e-09, 0.16, 0.42, 0.43, 0.39, 0.52, 0.375, 0.6, 0.7]
    feed(pm, [metrics(s + 1, kl_divergence_inference=v) for s, v in enumerate(kl)])
    finding = sentinel.take_pending()
    assert finding is not None and (finding.name, finding.step, finding.onset) == ("kl_spike", 9, 6)
    assert sentinel.rollback_target(finding) == (3, "")
    assert recorder.warnings[0].endswith("rolling back to step 3)")


def test_rollback_goes_back_before_the_first_finding_of_the_trouble(tmp_path: Path) -> None:
    """The entropy collapses at steps 5-6 (a warn finding, onset 5), the KL crosses its line at 10-11
    (rollback, onset 10): the trouble started at step 5, so the run goes back to step 2 (5 - 2 - 1)."""
    cfg = kl_rollback_config(tmp_path)
    sentinel, recorder, pm, _ = plugged(cfg)
    steps = [metrics(s) for s in range(1, 5)] + [metrics(s, entropy=0.2) for s in (5, 6)]
    steps += [metrics(s) for s in (7, 8, 9)] + [metrics(s, kl_divergence_inference=0.9) for s in (10, 11)]
    feed(pm, steps)
    finding = sentinel.take_pending()
    assert finding is not None and (finding.name, finding.onset) == ("kl_spike", 10)
    assert [(f.name, f.onset, f.action) for f in sentinel.findings][0] == ("entropy_collapse", 5, "warn")
    assert sentinel.window_start(finding) == 5 and sentinel.rollback_target(finding) == (2, "")
    # a finding older than the window (10 steps) is another episode: only the KL's own onset counts
    sentinel.findings[0] = replace(sentinel.findings[0], step=1, onset=1)
    assert sentinel.window_start(finding) == 10 and sentinel.rollback_target(finding) == (7, "")


def test_rollback_without_an_old_enough_checkpoint_or_budget_stops(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        health_entropy_collapse_action="rollback",
        checkpoint_every=5,
        health_max_rollbacks=1,
        max_async_rollout=0,
    )
    save_checkpoints(cfg, [10])
    sentinel, recorder, pm, _ = plugged(cfg)
    feed(pm, collapse_run()[:12])
    finding = sentinel.take_pending()
    assert finding is not None
    assert recorder.warnings[0].endswith(
        "rollback; stopping the run, not rolled back: no checkpoint at step 9 or before (checkpoint_every: 5))"
    )
    assert sentinel.rollback_target(finding) == (
        None,
        "no checkpoint at step 9 or before (checkpoint_every: 5)",
    )
    sentinel.rollbacks = 1
    target, why = sentinel.rollback_target(finding)
    assert (target, why) == (None, "health_max_rollbacks (1) used up")
    assert str(sentinel.stop(finding, "checkpoint: x", why)).endswith(
        "(health_entropy_collapse_action: rollback; not rolled back: health_max_rollbacks (1) used up); checkpoint: x"
    )


def test_rollback_needs_checkpoints_in_the_config(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="health_kl_spike_action: rollback restores a checkpoint.*set checkpoint_every"
    ):
        config(tmp_path, health_kl_spike_action="rollback")


def test_driver_side_of_a_rollback(tmp_path: Path) -> None:
    cfg = config(tmp_path, checkpoint_every=3, learning_rate=0.01)
    mgr = save_checkpoints(cfg, [3, 6, 9])
    assert health_rollback(RuntimeError("a trainer died"), cfg) is None
    wrapped = RuntimeError("session failed")
    wrapped.__cause__ = HealthRollback("health: kl_spike at step 8 ...", step=3, learning_rate=0.005)
    rollback = health_rollback(wrapped, cfg)
    assert rollback is not None
    assert (rollback.plan.point.step, rollback.plan.point.path) == (3, mgr.path(3))
    assert rollback.cfg.learning_rate == 0.005 and rollback.cfg.resume_from_checkpoint is False
    assert mgr.steps() == [3]  # 6 and 9 belong to the abandoned history: set aside, not deleted
    assert rollback.plan.reason.startswith("health: kl_spike at step 8")


def group(rewards: list[float], reason: str | None = None) -> RolloutGroup:
    samples = [RolloutSample([1], [2], [0.0], None, "stop", r, r) for r in rewards]
    return RolloutGroup(0, "reverse_text", 0, samples, discard_reason=reason)


@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_reward_saturated_ends_the_session_between_steps(tmp_path: Path, action: str) -> None:
    cfg = config(
        tmp_path, health_reward_saturated_action=action, health_reward_saturated_groups=4, checkpoint_every=2
    )
    sentinel, recorder, pm, failures = plugged(cfg)
    for _ in range(3):
        pm.hook.telescope_group_end(group=group([1.0, 1.0, 1.0], "zero_advantage"), step=5)
        pm.hook.telescope_group_end(group=group([1.0, 0.0]), step=5)
        pm.hook.telescope_group_end(group=group([1.0, 0.0], "off_policy"), step=5)  # cancelled: not counted
    # the last 4 finished groups: flat, mixed, flat, mixed; three flat ones leave one mixed in the window
    for rewards in ([0.0, 0.0, 0.0], [1.0, 1.0], [0.5, 0.5]):
        pm.hook.telescope_group_end(group=group(rewards, "zero_advantage"), step=5)
    assert not failures  # 3 of the last 4 flat: below 95%
    pm.hook.telescope_group_end(group=group([0.0, 0.0], "zero_advantage"), step=5)
    (error,) = failures
    assert isinstance(error, HealthStop)  # no checkpoint at step 3 or before: a rollback stops too
    assert str(error).startswith("health: reward_saturated at step 5: 100% of the last 4 finished groups")
    assert "no checkpoint of this step" in str(error) and sentinel.pending is None
    assert recorder.info["health"]["state"] == "stopped"


def record(prompt: str, completion: str, reason: str | None = None, stop: str = "stop") -> RolloutRecord:
    return RolloutRecord(
        step=1, group_id=0, env="x", sample_id=0, prompt_text=prompt, completion_text=completion,
        completion_ids=[1] * len(completion), discard_reason=reason, stop_reason=stop,
    )  # fmt: skip


def test_signals_from_real_records() -> None:
    rows = [record(f"p{i}", "same answer") for i in range(3)] + [
        record(f"p{i}", f"a{i}") for i in range(3, 6)
    ]
    rows += [record("p0", "same answer")] * 2  # one prompt's repeats count once
    rows.append(record("p9", "x" * 40, reason="off_policy", stop="abort"))  # cancelled: not the policy's
    rows.append(record("p5", "y" * 24, reason="zero_advantage", stop="length"))
    share, text = mode_share([r for r in rows if r.discard_reason != "off_policy"])
    assert (share, text) == (3 / 6, "same answer")
    signals = step_signals(4, {"entropy": 1.0, "loss": math.nan, "train/skipped_nonfinite_steps": 1.0}, rows)
    lengths = [11] * 3 + [2] * 3 + [11] * 2 + [24]
    assert signals.completion_tokens == pytest.approx(sum(lengths) / len(lengths))
    assert signals.truncated_share == pytest.approx(1 / 9)
    assert (signals.mode_share, signals.entropy, signals.kl) == (0.5, 1.0, None)
    assert signals.nonfinite == ("loss", "train/skipped_nonfinite_steps")
    assert mode_share(rows[:3])[0] is None  # fewer than 4 distinct prompts: no verdict


def truncated_step(step: int, truncated: int, prompts: int = 16, samples: int = 8) -> list[RolloutRecord]:
    """One step's records: ``prompts`` x ``samples`` completions, the first ``truncated`` of them cut at
    max_tokens (24 tokens, stop ``length``), the others 12-token answers that stopped on their own."""
    rows = []
    for i in range(prompts * samples):
        cut = i < truncated
        text = f"{i:03d}" * (8 if cut else 4)
        rows.append(
            replace(record(f"prompt {i // samples}", text, stop="length" if cut else "stop"), step=step)
        )
    return rows


def length_findings(tmp_path: Path, truncated: list[int]) -> tuple[list[str], list[float]]:
    """The warnings and the ``health/length_blowup`` metric of a run whose steps truncate this many."""
    _, recorder, pm, _ = plugged(config(tmp_path))
    for step, n in enumerate(truncated, start=1):
        rows = truncated_step(step, n)
        pm.hook.telescope_step_end(step=step, metrics=metrics(step), rollouts=rows)
    return recorder.warnings, [m["health/length_blowup"] for m in recorder.logged]


def test_a_run_truncated_from_its_first_step_is_no_length_blowup(tmp_path: Path) -> None:
    """Every completion hit max_tokens from step 1 (a limit too small for the task): the lengths start
    at the cap, so truncation cannot show them growing (this 3-step run raised length_blowup at step 3)."""
    warnings, marked = length_findings(tmp_path / "a", [128, 128, 128])
    assert warnings == [] and marked == [0.0, 0.0, 0.0]
    warnings, marked = length_findings(tmp_path / "b", [112, 120, 128])  # 88% at the start
    assert warnings == [] and marked == [0.0, 0.0, 0.0]
    # the same cap reached from a quarter truncated at step 1 is growth: raised at step 3
    warnings, marked = length_findings(tmp_path / "c", [32, 128, 128])
    assert marked == [0.0, 0.0, 1.0]  # the metric marks a raised finding
    (line,) = warnings
    assert line.startswith("health: length_blowup at step 3 (anomalous since step 2): 100% of completions")
    assert "median 25% over the run's first healthy step 1" in line
