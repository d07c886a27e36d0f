"""``zero_advantage_kind``: one function for the discard decision and the discard metrics.

The rollout pipeline (``rollouts/groups.py``) decides with it which groups to drop and the step
metrics (``observe/metrics.py``) count the kinds with it; they used to be two copies that
disagreed on a one-sample group (the metrics' copy called ``[0.0]`` ``all_zero``).
"""

from __future__ import annotations

import pytest

from telescope.core.observe import RolloutRecord, rollout_metrics
from telescope.core.observe.metrics import zero_advantage_kind as used_by_metrics
from telescope.core.observe.rundir.records import ZERO_ADVANTAGE_KINDS, zero_advantage_kind
from telescope.core.rollouts.groups import zero_advantage_kind as used_by_groups


def test_the_pipeline_and_the_metrics_use_the_same_function() -> None:
    assert used_by_groups is zero_advantage_kind and used_by_metrics is zero_advantage_kind


@pytest.mark.parametrize(
    ("rewards", "kind"),
    [
        ([0.0, 0.0, 0.0], "all_zero"),
        ([0.7, 0.7], "all_positive"),
        ([-1.0, -1.0], "all_equal"),
        ([0.0, 1e-12], "all_zero"),  # within the tolerance
        ([0.0, 1.0], None),
    ],
)
def test_kinds(rewards: list[float], kind: str | None) -> None:
    assert zero_advantage_kind(rewards) == kind
    assert kind is None or kind in ZERO_ADVANTAGE_KINDS


@pytest.mark.parametrize("rewards", [[], [0.0], [1.0], [-2.0]])
def test_fewer_than_two_rewards_are_never_a_zero_advantage_group(rewards: list[float]) -> None:
    # One sample has nothing to be equal to: with advantage_norm: batch (group_size 1) it is trained on.
    assert zero_advantage_kind(rewards) is None


def test_a_one_sample_group_is_counted_under_no_kind() -> None:
    rows = [
        RolloutRecord(step=1, group_id=0, env="a", sample_id=0, reward=0.0, discard_reason="zero_advantage"),
        *[
            RolloutRecord(
                step=1, group_id=1, env="a", sample_id=i, reward=0.0, discard_reason="zero_advantage"
            )
            for i in range(2)
        ],
    ]
    m = rollout_metrics(rows)
    assert m["discarded/zero_advantage/all_zero_groups"] == 1.0  # group 1 only
    assert m["discarded/zero_advantage/all_positive_groups"] == 0.0
    assert m["discarded/zero_advantage/all_equal_groups"] == 0.0
