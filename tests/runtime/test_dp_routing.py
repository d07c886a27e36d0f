"""Trainer groups route each actor the batch part of its data-parallel rank (TP/PP > 1).

The Ray boundary is faked: ``FakeActor`` stands for a Ray actor handle (``.method.remote``
returns an awaitable) around a fake backend laid out as Megatron lays out ranks with
TP=2, PP=2 (tensor-parallel rank fastest, then data-parallel, then pipeline stage).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.runtime.ray_group import RayTrainerGroup

TP, PP = 2, 2


class FakeTpPpBackend:
    """Fake trainer backend: rank r of a TP×DP×PP grid, recording the parts it trained on."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.dp_world_size = world_size // (TP * PP)
        self.dp_rank = (rank // TP) % self.dp_world_size
        self.trained: list[Any] = []

    def init(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "tp": TP,
            "pp": PP,
        }

    def train_step(self, part: Any) -> dict[str, float]:
        self.trained.append(part)
        return {"loss": float(self.rank)}


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(self.fn(*args))
        return future


class FakeActor:
    """Fake Ray actor handle: ``actor.init.remote()`` / ``actor.train_step.remote(x)`` awaitables."""

    def __init__(self, backend: FakeTpPpBackend) -> None:
        self.backend = backend
        self.init = _Method(backend.init)
        self.train_step = _Method(backend.train_step)


def _group(world_size: int) -> tuple[RayTrainerGroup, list[FakeTpPpBackend]]:
    backends = [FakeTpPpBackend(r, world_size) for r in range(world_size)]
    infos = [b.init() for b in backends]
    return RayTrainerGroup.from_info([FakeActor(b) for b in backends], infos, [], []), backends


def test_tp2_pp2_actors_get_the_part_of_their_dp_rank() -> None:
    group, backends = _group(world_size=8)  # TP 2 × DP 2 × PP 2
    assert group.dp_world_size == 2
    batch = SimpleNamespace(per_rank=["part-0", "part-1"])
    metrics = asyncio.run(group.train_step(1, batch))
    # Ranks 0,1 (dp 0, stage 0), 2,3 (dp 1, stage 0), 4,5 (dp 0, stage 1), 6,7 (dp 1, stage 1).
    expected = ["part-0", "part-0", "part-1", "part-1", "part-0", "part-0", "part-1", "part-1"]
    assert [b.trained for b in backends] == [[p] for p in expected]
    assert metrics == {"loss": 0.0}  # rank 0's


def test_one_actor_per_dp_rank_without_info_keeps_actor_i_on_part_i() -> None:
    backends = [FakeTpPpBackend(r, 4) for r in range(4)]
    group = RayTrainerGroup([FakeActor(b) for b in backends], 4)
    asyncio.run(group.train_step(1, SimpleNamespace(per_rank=["a", "b", "c", "d"])))
    assert [b.trained for b in backends] == [["a"], ["b"], ["c"], ["d"]]


@pytest.mark.parametrize(
    ("infos", "message"),
    [
        (
            [{"dp_rank": 0, "dp_world_size": 2}, {"dp_rank": 0, "dp_world_size": 2}],
            "no actor reports dp_rank 1",
        ),
        ([{"dp_rank": 0, "dp_world_size": 2}, {"dp_rank": 2, "dp_world_size": 2}], "dp_rank 2 is outside"),
        ([{"dp_rank": 0, "dp_world_size": 1}, {"dp_rank": 1, "dp_world_size": 2}], "dp_world_size differs"),
        ([{"dp_rank": r, "dp_world_size": 3} for r in (0, 1, 2, 0)], "does not divide the 4 trainer actors"),
    ],
)
def test_inconsistent_layouts_are_refused(infos: list[dict[str, int]], message: str) -> None:
    actors = [object() for _ in infos]
    with pytest.raises(ValueError, match=message):
        RayTrainerGroup.from_info(actors, infos, [], [])
