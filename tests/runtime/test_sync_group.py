"""The weight-sync group a run forms: one rank per receiving process, NCCL only GPU to GPU."""

from __future__ import annotations

import re

import pytest

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.runtime.assemble import sync_backend, sync_group_layout, sync_group_spec
from telescope.core.weights.settings import GroupSpec

from ..inference.conftest import make_cfg


@pytest.mark.parametrize(("servers", "tp"), [(1, 1), (3, 1), (2, 2), (2, 4), (4, 8)])
def test_every_worker_gets_its_own_rank(servers: int, tp: int) -> None:
    world, firsts = sync_group_layout(servers, tp)
    # The vLLM worker extension joins as first + tp_rank (worker.py); rank 0 is the trainer.
    ranks = [first + tp_rank for first in firsts for tp_rank in range(tp)]
    assert world == 1 + servers * tp
    assert sorted(ranks) == list(range(1, world))  # disjoint and covering every receiver rank


def test_vllm_servers_add_one_member_per_tensor_parallel_worker() -> None:
    cfg = make_cfg(model="org/m", inference_num_workers=8, inference_tensor_parallel_size=4)
    engine = VllmEngine(cfg, VllmEngineKwargs())
    assert engine.num_servers == 2 and engine.sync_ranks_per_server == 4
    assert sync_group_layout(engine.num_servers, engine.sync_ranks_per_server) == (9, [1, 5])


def test_transformers_servers_add_one_member_each() -> None:
    from telescope.core.plugins import load_plugins

    _, registry = load_plugins()
    engine = registry.create("inference_engine", "transformers", {}, cfg=make_cfg(inference_num_workers=3))
    assert engine.sync_ranks_per_server == 1


@pytest.mark.parametrize(
    ("trainer_gpus", "inference_gpus", "backend"),
    [(0, 0, "gloo"), (1, 0, "gloo"), (0, 1, "gloo"), (1, 1, "nccl"), (0.5, 1, "nccl")],
)
def test_nccl_only_when_both_ends_are_on_gpus(
    trainer_gpus: float, inference_gpus: float, backend: str
) -> None:
    assert sync_backend(trainer_gpus, inference_gpus) == backend


def test_the_init_timeout_bounds_the_sync_group() -> None:
    spec = GroupSpec(
        **sync_group_spec(make_cfg(ray_broadcast_init_timeout_s=42), "10.0.0.1", 29500, 5, "nccl")
    )
    assert (spec.host, spec.port, spec.world_size, spec.backend, spec.timeout_s) == (
        "10.0.0.1",
        29500,
        5,
        "nccl",
        42.0,
    )


def test_every_group_gets_a_fresh_name_that_servers_accept() -> None:
    """The group's store keys live under a name drawn per group: a process that reaches the store's
    port cannot guess them, and a server refuses a group without one (test_server_doors)."""
    from telescope.core.inference.protocol import WeightSyncInitRequest

    cfg = make_cfg()
    names = {sync_group_spec(cfg, "127.0.0.1", 29500, 2, "gloo")["group_name"] for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert re.fullmatch(r"telescope-weights-[0-9a-f]{32}", name)
        assert WeightSyncInitRequest(host="127.0.0.1", port=1, world_size=2, rank=1, group_name=name)
    with pytest.raises(ValueError, match="carries no nonce"):
        WeightSyncInitRequest(host="127.0.0.1", port=1, world_size=2, rank=1, group_name="telescope-weights")
