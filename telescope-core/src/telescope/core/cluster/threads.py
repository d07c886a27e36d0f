"""How many torch intra-op threads each trainer rank and transformers-engine server uses.

The rule (``choose_torch_threads``), per component:

1. an explicit ``trainer_torch_threads`` / ``inference_torch_threads`` wins;
2. sync mode (``max_async_rollout: 0``): trainer and servers never compute at the same time, so
   each side may use the whole node: its cores divided among the processes of that side
   (``trainer_num_workers`` ranks or the servers), at least one thread each;
3. async mode: both sides compute at once, so each process uses the CPUs Ray placed it with,
   ``ray_<side>_cpus_per_worker`` **rounded up** (0.5 -> 1, 1.5 -> 2), at most the node's cores.

Light module: no torch import (the caller sets the count).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["ThreadChoice", "choose_torch_threads", "node_cpus"]

Component = Literal["trainer", "inference"]


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and the rule that produced it (logged and recorded in ``run.json``)."""

    threads: int
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_cpus() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unsupported)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def choose_torch_threads(cfg: TelescopeConfig, component: Component, cpus: int | None = None) -> ThreadChoice:
    """Threads for one ``component`` process of the run ``cfg`` on a node with ``cpus`` cores."""
    cpus = max(1, cpus if cpus is not None else node_cpus())
    override = cfg.trainer_torch_threads if component == "trainer" else cfg.inference_torch_threads
    if override is not None:
        return ThreadChoice(int(override), f"{component}_torch_threads")
    if cfg.max_async_rollout == 0:
        peers = cfg.trainer_num_workers if component == "trainer" else cfg.num_inference_servers
        threads = max(1, cpus // max(1, peers))
        return ThreadChoice(threads, f"sync: {cpus} node cores / {peers} {component} process(es)")
    placed = cfg.ray_trainer_cpus_per_worker if component == "trainer" else cfg.ray_inference_cpus_per_worker
    threads = min(cpus, max(1, math.ceil(placed)))
    return ThreadChoice(threads, f"async: ray_{component}_cpus_per_worker {placed:g} rounded up")
