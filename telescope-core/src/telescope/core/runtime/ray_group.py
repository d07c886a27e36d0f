"""Ray actors for the two pools, and the trainer handle the orchestrator drives."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telescope.core.runtime.cluster import Pools, scheduling
from telescope.core.runtime.workers import InferenceServerWorker, TrainerWorker

if TYPE_CHECKING:
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.rollouts.batching import TrainBatch

__all__ = ["RayTrainerGroup", "Servers", "dp_layout_problem", "start_servers", "start_trainers"]

log = logging.getLogger("telescope.runtime")


@dataclass
class Servers:
    """The inference server actors and their URLs."""

    actors: list[Any]
    urls: list[str]
    node_ips: list[str]


@dataclass
class RayTrainerGroup:
    """Trainer rank actors; implements the orchestrator's ``TrainerHandle``.

    The batch has one part per data-parallel rank; with tensor or pipeline parallelism
    several actors share a dp rank and all of them get that part.
    """

    actors: list[Any]
    dp_world_size: int
    clients: list[ServerClient] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    dp_ranks: list[int] = field(default_factory=list)
    """The data-parallel rank of each actor (from its ``init`` info); empty = actor i is dp rank i."""
    excluded: set[int] = field(default_factory=set)
    """Servers dropped from the run (dead past ``inference_max_restarts``): not in the sync group."""

    @classmethod
    def from_info(
        cls, actors: list[Any], infos: list[dict[str, Any]], clients: list[ServerClient], urls: list[str]
    ) -> RayTrainerGroup:
        """The group for ``actors`` whose ``init`` returned ``infos`` (``dp_rank``, ``dp_world_size``)."""
        dp = int(infos[0].get("dp_world_size", len(actors))) if infos else len(actors)
        ranks = [int(info.get("dp_rank", i)) for i, info in enumerate(infos)]
        problem = dp_layout_problem(ranks, [int(i.get("dp_world_size", dp)) for i in infos], len(actors))
        if problem:
            raise ValueError(f"trainer ranks report an inconsistent data-parallel layout: {problem}")
        return cls(actors, dp, clients, urls, ranks)

    async def train_step(self, step: int, batch: TrainBatch) -> dict[str, float]:
        """Every rank trains on its dp rank's part; rank 0's metrics are the step's (all-reduced)."""
        ranks = self.dp_ranks or list(range(len(self.actors)))
        refs = [actor.train_step.remote(batch.per_rank[ranks[i]]) for i, actor in enumerate(self.actors)]
        results = await asyncio.gather(*refs)
        return dict(results[0])

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, Any]:
        """Trainer rank 0 broadcasts; every server receives; fingerprints must agree.

        Servers in ``hold`` (eval servers kept at an eval step's weights) take part in the
        broadcast and verify it, but do not load the new weights.
        """
        from telescope.core.weights.verify import check_sync

        start = time.perf_counter()
        sends = [actor.send_weights.remote(version) for actor in self.actors]
        members = [i for i in range(len(self.clients)) if i not in self.excluded]
        receives = [self.clients[i].update_weights(version, apply=i not in hold) for i in members]
        results = await asyncio.gather(asyncio.gather(*sends), asyncio.gather(*receives))
        sent, loaded = results[0][0], results[1]
        urls = [self.urls[i] for i in members]
        check_sync(
            sent.get("fingerprints"),
            {url: r.fingerprints for url, r in zip(urls, loaded, strict=True)},
            version,
        )
        fingerprints = sent.get("fingerprints") or {}
        loads = [r.load_seconds for r in loaded if r.load_seconds is not None]
        load_metric = {"weight_sync/server_load_seconds": max(loads)} if loads else {}
        return {
            **load_metric,
            "digest": _digest(fingerprints),
            "timing_weight_sync_trainer_total": float(sent.get("seconds", 0.0)),
            "timing_weight_sync_inference_total": max((r.seconds for r in loaded), default=0.0),
            "timing_weight_sync_total": time.perf_counter() - start,
            "weight_sync/num_tensors": float(sent.get("num_tensors", 0)),
            "weight_sync/bytes": float(sent.get("num_bytes", 0)),
            "weight_sync/seconds": time.perf_counter() - start,
        }

    async def save_checkpoint(self, directory: str, training_state: bool) -> None:
        """Every rank writes its shard of the checkpoint into ``directory``."""
        await asyncio.gather(*[a.save_checkpoint.remote(directory, training_state) for a in self.actors])

    async def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Every rank restores ``directory``; returns rank 0's report (``step``, ``training_state``)."""
        results = await asyncio.gather(*[a.load_checkpoint.remote(directory) for a in self.actors])
        return dict(results[0] or {})


def dp_layout_problem(dp_ranks: list[int], dp_world_sizes: list[int], num_actors: int) -> str | None:
    """Why these per-actor (dp_rank, dp_world_size) reports cannot be routed, or None."""
    if len(dp_ranks) != num_actors:
        return f"{len(dp_ranks)} reports for {num_actors} trainer actors"
    sizes = sorted(set(dp_world_sizes))
    if len(sizes) != 1:
        return f"dp_world_size differs between ranks ({sizes})"
    dp = sizes[0]
    if dp < 1 or num_actors % dp:
        return f"dp_world_size {dp} does not divide the {num_actors} trainer actors"
    bad = [r for r in dp_ranks if not 0 <= r < dp]
    if bad:
        return f"dp_rank {bad[0]} is outside [0, {dp}) (dp_world_size {dp})"
    missing = sorted(set(range(dp)) - set(dp_ranks))
    if missing:
        return f"no actor reports dp_rank {missing[0]}, so its part of the batch would never train"
    return None


def _digest(fingerprints: dict[str, str]) -> str:
    """One short id for a whole set of per-tensor fingerprints (shown in the sync event)."""
    import hashlib

    text = "\n".join(f"{k}={v}" for k, v in sorted(fingerprints.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16] if fingerprints else ""


def start_trainers(
    cfg_data: dict[str, Any], plugins: list[str], pools: Pools, world_size: int, cpus: float
) -> list[Any]:
    """Create the trainer rank actors (one bundle each) on a shared rendezvous address."""
    import ray

    from telescope.core.runtime.supervision.heartbeat import HEALTH_GROUP

    # heartbeats get a thread of their own: a rank answers them in the middle of a step
    make_remote: Any = ray.remote  # its stubs do not list concurrency_groups
    remote: Any = make_remote(concurrency_groups={HEALTH_GROUP: 1})(TrainerWorker)
    master = rendezvous_host([bundle_ip(pools.trainer, rank) for rank in range(world_size)])
    port = node_free_port(pools.trainer, 0)
    actors = []
    for rank in range(world_size):
        actor = remote.options(
            num_cpus=cpus,
            num_gpus=pools.trainer_gpus,
            max_restarts=0,
            scheduling_strategy=scheduling(pools.trainer, rank),
            name=None,
        ).remote(cfg_data, plugins, rank, world_size, master, port)
        actors.append(actor)
    return actors


def rendezvous_host(rank_node_ips: list[str]) -> str:
    """Rank 0's address for the trainer rendezvous: loopback (fastest, always reachable) only when
    every rank shares rank 0's node, whichever node the driver is on."""
    from telescope.core.cluster.addresses import LOOPBACK

    first = rank_node_ips[0]
    return LOOPBACK if all(ip == first for ip in rank_node_ips) else first


def node_free_port(pg: Any, index: int) -> int:
    """A port free on the node of bundle ``index`` (rank 0 listens there, not on the driver's node)."""
    import ray

    from telescope.core.cluster.claims import rendezvous_port

    probe: Any = ray.remote(num_cpus=0)(rendezvous_port)
    owner = {"pid": os.getpid(), "host": socket.gethostname()}  # the driver: the run's end releases it
    return int(
        ray.get(probe.options(scheduling_strategy=scheduling(pg, index)).remote("0.0.0.0", owner=owner))
    )


def bundle_ip(pg: Any, index: int) -> str:
    """The IP of the node holding bundle ``index`` of placement group ``pg``."""
    import ray
    from ray.util.placement_group import placement_group_table

    node_id = placement_group_table(pg)["bundles_to_node_id"][index]
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    return "127.0.0.1"


def start_servers(
    cfg_data: dict[str, Any],
    plugins: list[str],
    pools: Pools,
    engine: str,
    num_servers: int,
    cpus: float,
    log_dir: str,
) -> Servers:
    """Create one server actor per bundle and wait for every server to answer /health."""
    import ray

    from telescope.core.cluster.addresses import DRIVER_ADDRESS_ENV, reachable_url

    remote: Any = ray.remote(InferenceServerWorker)
    driver_ip = str(ray.util.get_node_ip_address())
    # Servers on other nodes send their traces to the driver's node (merged with the job's env_vars).
    env = {"env_vars": {DRIVER_ADDRESS_ENV: driver_ip}}
    actors: list[Any] = [
        remote.options(
            num_cpus=cpus,
            num_gpus=pools.inference_gpus,
            max_restarts=0,
            runtime_env=env,
            scheduling_strategy=scheduling(pools.inference, i),
        ).remote(cfg_data, plugins, i, engine, log_dir)
        for i in range(num_servers)
    ]
    infos = ray.get([a.start.remote() for a in actors])
    # Each server reports how its own node reaches it; the driver may be elsewhere.
    urls = [
        reachable_url(
            i["url"],
            i["node_ip"],
            driver_ip,
            bound_host=str(cfg_data["inference_host"]),
            what=f"inference server {n}",
        )
        for n, i in enumerate(infos)
    ]
    return Servers(actors, urls, [i["node_ip"] for i in infos])
