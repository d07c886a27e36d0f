"""Seeded multi-environment scheduling: proportions, coverage, exclusions, exact continuation."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from telescope.core.rollouts.groups import normalize_reward, zero_advantage_kind
from telescope.core.rollouts.lanes import Lanes, QueuedSample
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv


def test_weighted_proportions_within_statistical_bounds() -> None:
    sched = PromptScheduler([SourceEnv("a", 3.0, 50), SourceEnv("b", 1.0, 50)], seed=7)
    n = 4000
    counts = Counter(sched.next().env_name for _ in range(n))
    p = 0.75
    sd = math.sqrt(n * p * (1 - p))
    assert abs(counts["a"] - n * p) < 4 * sd  # a 4-sigma binomial bound


def test_epochs_cover_every_usable_sample_once() -> None:
    sched = PromptScheduler([SourceEnv("a", 1.0, 10, excluded=frozenset({0, 1}))], seed=1)
    first_epoch = [sched.next().sample_idx for _ in range(8)]
    assert sorted(first_epoch) == list(range(2, 10))
    second = [sched.next() for _ in range(8)]
    assert sorted(i.sample_idx for i in second) == list(range(2, 10)) and {i.epoch for i in second} == {1}


def test_same_seed_same_sequence_and_state_resume() -> None:
    envs = [SourceEnv("a", 1.0, 7), SourceEnv("b", 2.0, 5)]
    one = PromptScheduler(envs, seed=3)
    seq = [one.next() for _ in range(30)]
    two = PromptScheduler(envs, seed=3)
    head = [two.next() for _ in range(12)]
    state = two.state_dict()
    resumed = PromptScheduler(envs, seed=3)
    resumed.load_state_dict(state)
    tail = [resumed.next() for _ in range(18)]
    assert head + tail == seq
    assert [i.group_id for i in seq] == list(range(30))
    assert PromptScheduler(envs, seed=4).next() != seq[0] or PromptScheduler(envs, seed=5).next() != seq[0]


def test_all_samples_excluded_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no training samples left"):
        PromptScheduler([SourceEnv("a", 1.0, 2, excluded=frozenset({0, 1}))], seed=0)


def test_reward_normalisation_and_zero_advantage_kinds() -> None:
    assert normalize_reward(1.0, 0.0, 2.0) == 0.5
    assert normalize_reward(3.0, None, 2.0) == 3.0
    assert zero_advantage_kind([0.0, 0.0]) == "all_zero"
    assert zero_advantage_kind([1.0, 1.0, 1.0]) == "all_positive"
    assert zero_advantage_kind([-0.5, -0.5]) == "all_equal"
    assert zero_advantage_kind([0.0, 1.0]) is None
    assert zero_advantage_kind([1.0]) is None


def test_lanes_reuse_smallest_slot_and_queue_per_server() -> None:
    lanes = Lanes(2, 2)
    assert lanes.pick_server(1) == 0
    for i in range(3):
        lanes.enqueue(0, QueuedSample(7, i))
    ready = lanes.pop_ready()
    assert [(r.server, r.slot, r.sample.index) for r in ready] == [(0, 0, 0), (0, 1, 1)]
    assert lanes.queued_count() == 1 and lanes.pick_server(1) == 1
    lanes.release(0, 0)
    assert lanes.pop_ready()[0].slot == 0
    lanes.enqueue(1, QueuedSample(9, 0))
    assert lanes.drop_group(9) == 1
