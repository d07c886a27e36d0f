"""records_from_group against the orchestrator's own RolloutGroup/RolloutSample types."""

from __future__ import annotations

import pytest

from telescope.core.observe import rollout_metrics
from telescope.core.observe.adapters import records_from_group

groups = pytest.importorskip("telescope.core.rollouts.groups")


def _sample(reward: float, n: int, finish: str = "stop"):
    return groups.RolloutSample(
        prompt_ids=[1, 2],
        completion_ids=list(range(n)),
        inference_logprobs=[0.0] * n,
        loss_mask=None,
        finish_reason=finish,
        reward=reward,
        raw_reward=reward * 2,
        sample_metrics={"correct": reward},
        prompt_text="p",
        completion_text="c" * n,
        server=1,
        lane=3,
        model_version_start=4,
        timings={"generation": 0.5},
        advantage=reward - 0.5,
    )


def test_records_from_group_maps_every_field() -> None:
    group = groups.RolloutGroup(
        group_id=7,
        env_name="countdown",
        sample_idx=42,
        samples=[_sample(1.0, 3), _sample(0.0, 5, "length")],
        model_version=4,
    )
    rows = records_from_group(group, step=6, off_policy_steps=1)
    assert [r.sample_id for r in rows] == [0, 1]
    r = rows[1]
    assert (r.step, r.group_id, r.env, r.prompt_idx) == (6, 7, "countdown", 42)
    assert (r.completion_tokens, r.stop_reason, r.reward, r.raw_reward, r.advantage) == (
        5,
        "length",
        0.0,
        0.0,
        -0.5,
    )
    assert (r.server, r.lane, r.model_version, r.off_policy_steps, r.kept) == (1, 3, 4, 1, True)
    assert r.timings == {"generation": 0.5} and r.sample_metrics == {"correct": 0.0}
    assert rollout_metrics(rows)["rollouts/stop_reason_length_pct"] == 50.0


def test_discarded_group_carries_reason_and_kind() -> None:
    group = groups.RolloutGroup(
        group_id=1, env_name="e", sample_idx=0, samples=[_sample(0.0, 2), _sample(0.0, 2)]
    )
    group.discard_reason = "zero_advantage"
    group.zero_advantage_kind = groups.zero_advantage_kind(group.rewards)
    rows = records_from_group(group, step=2)
    assert all(r.discard_reason == "zero_advantage" and r.zero_advantage_kind == "all_zero" for r in rows)
    assert rollout_metrics(rows)["discarded/zero_advantage/all_zero_groups"] == 1.0
    cancelled = records_from_group(group, step=2, discard_reason="off_policy")
    assert all(r.cancelled and r.zero_advantage_kind is None for r in cancelled)


def test_token_view_fields_only_when_the_runtime_decoded_tokens() -> None:
    plain = _sample(1.0, 3)
    multi = _sample(1.0, 4)
    multi.completion_token_texts = ["a", "b", "\n", "c"]
    multi.inference_logprobs = [-0.123456, -1.0, 0.0, -2.5]
    multi.loss_mask = [1, 1, 0, 1]  # the third token was written by the environment
    group = groups.RolloutGroup(group_id=1, env_name="e", sample_idx=0, samples=[plain, multi])
    rows = records_from_group(group, step=1)
    assert rows[0].completion_token_texts is None and "completion_logprobs" not in rows[0].to_dict()
    assert rows[1].completion_token_texts == ["a", "b", "\n", "c"]
    assert rows[1].completion_logprobs == [-0.1235, -1.0, None, -2.5]
    assert rows[1].to_dict()["completion_logprobs"] == [-0.1235, -1.0, None, -2.5]
