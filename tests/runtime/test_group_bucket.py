"""GroupBucket: the groups waiting for a batch, and the ones too old to train (max_async)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from telescope.core.rollouts.batching import GroupBucket


@dataclass
class Group:
    """A finished group as the bucket sees it; counts how often its age is read."""

    group_id: int
    version: int
    discard_reason: str | None = None
    reads: int = 0

    @property
    def oldest_version(self) -> int:
        self.reads += 1
        return self.version


def reference(ops: list[tuple[str, Any]], size: int, max_async: int) -> list[Any]:
    """The rule written plainly: after every arrival, drop what is too old for the step, then cut batches."""
    waiting: list[Group] = []
    out: list[Any] = []
    for op, value in ops:
        if op == "add":
            waiting.append(value)
        else:
            step = value
            old = [g.group_id for g in waiting if step - g.version > max_async]
            waiting = [g for g in waiting if step - g.version <= max_async]
            out.append(("old", old))
            if len(waiting) >= size:
                taken, waiting = waiting[:size], waiting[size:]
                out.append(("batch", sorted(g.group_id for g in taken)))
    return out


def test_matches_the_plain_rule_on_random_arrivals() -> None:
    rng = random.Random(7)
    for trial in range(200):
        size, max_async = rng.randint(1, 4), rng.randint(0, 2)
        ops: list[tuple[str, Any]] = []
        step = 0
        for gid in range(rng.randint(1, 40)):
            ops.append(("add", Group(gid, max(0, step - rng.randint(0, 4)))))
            step += rng.random() < 0.3
            ops.append(("check", step))
        bucket = GroupBucket(size, max_async)
        got: list[Any] = []
        for op, value in ops:
            if op == "add":
                bucket.add(Group(value.group_id, value.version))
                continue
            old = bucket.drop_too_old(value)
            assert all(g.discard_reason == "max_async" for g in old)
            got.append(("old", [g.group_id for g in old]))
            taken = bucket.take()
            if taken is not None:
                got.append(("batch", [g.group_id for g in taken]))
        assert got == reference(ops, size, max_async), trial


def test_waiting_groups_are_checked_once_per_step_not_once_per_arrival() -> None:
    bucket = GroupBucket(size=10_000, max_async_rollout=1)
    groups = [Group(i, 5) for i in range(1000)]
    for group in groups:
        bucket.add(group)
        assert bucket.drop_too_old(5) == []
    assert all(g.reads == 1 for g in groups)  # each new arrival read once at step 5
    assert bucket.drop_too_old(6) == [] and all(g.reads == 2 for g in groups)  # a new step rereads all
    old = bucket.drop_too_old(7)
    assert len(old) == 1000 and len(bucket) == 0
