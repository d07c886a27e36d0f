"""rollout_metrics on a constructed step, checked against values computed by hand."""

from __future__ import annotations

import pytest

from telescope.core.observe import RolloutRecord, perf_metrics, rollout_metrics


def _group(
    gid: int, rewards, lengths, *, prompt_len=5, stops=None, advs=None, reason=None, kind=None, extra=None
):
    rows = []
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        metrics = {"correct": float(r > 0)}
        if extra is not None:
            metrics["bonus"] = extra[i]
        rows.append(
            RolloutRecord(
                step=1,
                group_id=gid,
                env="a",
                sample_id=i,
                prompt_ids=[0] * prompt_len,
                completion_ids=[1] * n,
                reward=r,
                advantage=(advs or [0.0] * len(rewards))[i],
                stop_reason=(stops or ["stop"] * len(rewards))[i],
                sample_metrics=metrics,
                discard_reason=reason,
                zero_advantage_kind=kind,
            )
        )
    return rows


@pytest.fixture
def step_rows() -> list[RolloutRecord]:
    rows = _group(
        0,
        [1, 0, 0, 1],
        [10, 20, 30, 40],
        stops=["stop", "length", "stop", "stop"],
        advs=[1, -1, -1, 1],
        extra=[1.0, 2.0, 3.0, 4.0],
    )
    rows += _group(
        1,
        [2, 0, 0, 0],
        [4, 4, 4, 8],
        prompt_len=3,
        stops=["length", "length", "stop", "stop"],
        advs=[1.5, -0.5, -0.5, -0.5],
    )
    rows += _group(2, [1, 0, 1, 0], [7] * 4, prompt_len=2, reason="max_async")
    rows += _group(3, [0] * 4, [1] * 4, prompt_len=2, reason="zero_advantage")  # kind computed here
    rows += _group(4, [1] * 4, [1] * 4, prompt_len=2, reason="zero_advantage", kind="all_positive")
    rows += _group(5, [-0.5] * 4, [1] * 4, prompt_len=2, reason="zero_advantage")
    rows += [
        RolloutRecord(step=1, group_id=9, env="a", sample_id=i, discard_reason="off_policy") for i in range(2)
    ]
    rows.append(RolloutRecord(step=1, group_id=9, env="a", sample_id=2, discard_reason="eval_drain"))
    return rows


def test_reward_and_advantage(step_rows) -> None:
    m = rollout_metrics(step_rows)
    assert m["reward/mean"] == pytest.approx(0.5)
    assert m["reward/std"] == pytest.approx(0.5**0.5)
    assert (m["reward/min"], m["reward/max"]) == (0.0, 2.0)
    assert m["reward/gini_mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert m["advantage/mean"] == pytest.approx(0.0)
    assert (m["advantage/min"], m["advantage/max"]) == (-1.0, 1.5)
    assert "reward/a/mean" not in m  # per-env reward only with several environments


def test_sample_metrics_aggregated_per_step_and_group(step_rows) -> None:
    m = rollout_metrics(step_rows)
    # correct = [1,0,0,1, 1,0,0,0]: mean 3/8; Gini per group 0.5 and 0.75
    assert m["sample_metrics/correct/mean"] == pytest.approx(3 / 8)
    assert m["sample_metrics/correct/gini_mean"] == pytest.approx(0.625)
    # bonus only in group 0: [1,2,3,4] -> mean 2.5, std sqrt(1.25), Gini 10*2/(2*16*2.5)=0.25
    assert m["sample_metrics/bonus/mean"] == pytest.approx(2.5)
    assert m["sample_metrics/bonus/std"] == pytest.approx(1.25**0.5)
    assert m["sample_metrics/bonus/gini_mean"] == pytest.approx(0.25)


def test_token_lengths_and_group_lengths(step_rows) -> None:
    m = rollout_metrics(step_rows)
    assert m["tokens/completion/mean"] == pytest.approx(15.0)
    assert (m["tokens/completion/min"], m["tokens/completion/max"]) == (4.0, 40.0)
    assert m["tokens/prompt/mean"] == pytest.approx(4.0)
    assert m["tokens/total/mean"] == pytest.approx(19.0)
    assert m["rollouts/stop_reason_length_pct"] == pytest.approx(100 * 3 / 8)
    # Gini of [10,20,30,40] = 0.25, of [4,4,4,8] = 0.15
    assert m["rollouts/group_length_gini_mean"] == pytest.approx(0.2)
    # max/median: 40/25 = 1.6 and 8/4 = 2.0
    assert m["rollouts/group_length_max_median_ratio_mean"] == pytest.approx(1.8)
    assert (m["rollouts/count"], m["rollouts/groups"]) == (8.0, 2.0)


def test_discards_and_breakdown(step_rows) -> None:
    m = rollout_metrics(step_rows, extra_cancelled=1)
    assert m["discarded/count"] == 16.0
    assert m["discarded/pct"] == pytest.approx(100 * 16 / 24)
    assert m["discarded/max_async/count"] == 4.0
    assert m["discarded/max_async/pct"] == pytest.approx(100 * 4 / 24)
    assert m["discarded/zero_advantage/count"] == 12.0
    assert m["discarded/zero_advantage/pct"] == pytest.approx(50.0)
    assert m["discarded/zero_advantage/all_zero_groups"] == 1.0
    assert m["discarded/zero_advantage/all_positive_groups"] == 1.0
    assert m["discarded/zero_advantage/all_equal_groups"] == 1.0
    assert m["discarded/zero_advantage/reward_mean"] == pytest.approx((4 * 1 - 4 * 0.5) / 12)
    assert m["discarded/tokens/completion/mean"] == pytest.approx((4 * 7 + 12 * 1) / 16)
    assert m["cancelled/count"] == 4.0
    assert (m["cancelled/off_policy/count"], m["cancelled/eval_drain/count"]) == (2.0, 1.0)


def test_multi_env_reward_and_empty_step() -> None:
    rows = _group(0, [1, 0], [3, 3]) + [
        RolloutRecord(step=1, group_id=1, env="b", sample_id=i, reward=0.5, completion_ids=[1])
        for i in range(2)
    ]
    m = rollout_metrics(rows)
    assert m["reward/a/mean"] == pytest.approx(0.5)
    assert m["reward/b/mean"] == pytest.approx(0.5)
    empty = rollout_metrics([])
    assert empty["discarded/count"] == 0.0 and "reward/mean" not in empty


def test_every_discard_reason_is_counted_and_none_raises() -> None:
    def row(gid: int, reason: str | None, env: str = "a", **metrics: float) -> RolloutRecord:
        return RolloutRecord(
            step=1, group_id=gid, env=env, sample_id=0, discard_reason=reason, sample_metrics=dict(metrics)
        )

    rows = [
        row(0, None),
        row(1, "rollout_error"),
        row(2, "rollout_error"),
        row(3, "prompt_too_long"),
        row(4, "reward_error", env="b", reward_error=1.0),
        row(5, "reward_error", env="b", reward_timeout=1.0),
        row(6, "from_a_plugin"),
        row(7, "off_policy"),
    ]
    m = rollout_metrics(rows)
    # 7 finished rollouts (1 kept + 6 discarded); the cancelled one is not a discard
    assert m["discarded/count"] == 6.0 and m["cancelled/count"] == 1.0
    assert m["discarded/rollout_error/count"] == 2.0 and m["discarded/prompt_too_long/count"] == 1.0
    assert m["discarded/reward_error/count"] == 2.0 and m["discarded/from_a_plugin/count"] == 1.0
    assert m["discarded/from_a_plugin/pct"] == pytest.approx(100 / 7)
    assert m["discarded/max_async/count"] == 0.0
    assert m["reward/b/errors"] == 2.0 and m["reward/a/errors"] == 0.0


def test_perf_metrics() -> None:
    m = perf_metrics(step_time_s=2.0, tokens=1000, async_level=1)
    assert m == {
        "perf/step_time_s": 2.0,
        "perf/tokens": 1000.0,
        "perf/tokens_per_s": 500.0,
        "perf/async_level": 1.0,
    }
