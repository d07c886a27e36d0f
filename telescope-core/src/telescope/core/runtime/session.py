"""``RunSession``: Ray, the worker pools and every actor of one run attempt, started and stopped together.

A recovering run (``driver._train_recovering``) makes a new session per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.cluster.signals import route_sigterm_to_interrupt
from telescope.core.config import TelescopeConfig

if TYPE_CHECKING:
    from telescope.core.observe.samplers.otlp import OtlpReceiver
    from telescope.core.registry import Registry
    from telescope.core.runtime.checkpointing import ResumePoint
    from telescope.core.runtime.orchestrator import Orchestrator
    from telescope.core.runtime.supervision.liveness import RunSnapshot

__all__ = ["RunSession"]

log = logging.getLogger("telescope.runtime")


class RunSession:
    """Owns Ray, the pools and every actor of one run."""

    def __init__(self, cfg: TelescopeConfig, plugins: list[str], registry: Registry, run_dir: Path) -> None:
        self.cfg = cfg
        self.plugins = plugins
        self.registry = registry
        self.run_dir = run_dir
        self.pools: Any = None
        self.servers: Any = None
        self.trainers: list[Any] = []
        self.trainer_info: list[dict[str, Any]] = []
        self.started_here = True
        self.resume: ResumePoint | None = None
        """The checkpoint this run continues from, or None."""
        self._failure: BaseException | None = None
        self.run_id = ""
        """Names this run's placement groups (the run directory's run id; empty = a random one)."""
        self._claims: list[Any] = []
        self.orchestrator: Orchestrator | None = None
        self.traces: OtlpReceiver | None = None
        """The OTLP receiver of vLLM's request timings (``enable_vllm_tracing``), kept across restarts."""
        self.logger_ids: Callable[[], dict[str, Any]] = dict
        """Each logger's run ids (``LoggerHub.run_ids``), stored in checkpoints so a resume continues them."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._abort: asyncio.Event | None = None

    def current_step(self) -> int:
        """The training step in progress (0 before the orchestrator exists)."""
        if self.orchestrator is None:
            return 0
        return int(self.orchestrator.counts.completed_steps) + 1

    def start(self) -> None:
        """Ray, placement groups, inference servers and trainer ranks (created concurrently)."""
        import ray

        from telescope.core.inference.settings import num_servers
        from telescope.core.runtime.cluster import connect, reserve_pools
        from telescope.core.runtime.ray_group import start_servers, start_trainers

        joined = connect(self.cfg, str(self.run_dir))
        self.started_here = bool(joined["started_here"])
        self._claims += [joined["private_claim"]] if joined.get("private_claim") else []
        route_sigterm_to_interrupt()  # ray.init installed its own (sys.exit from any frame)
        use_gpus = ray.cluster_resources().get("GPU", 0) > 0
        self.pools = reserve_pools(
            self.cfg, num_servers(self.cfg), use_gpus, self.run_id, static_cluster=self.started_here
        )
        self._move_ports_if_taken(num_servers(self.cfg))
        cfg, data = self.cfg, self.cfg.to_dict()
        self.trainers = start_trainers(
            data, self.plugins, self.pools, cfg.trainer_num_workers, cfg.ray_trainer_cpus_per_worker
        )
        init_refs = [t.init.remote() for t in self.trainers]
        self.servers = start_servers(
            data,
            self.plugins,
            self.pools,
            cfg.inference_engine,
            num_servers(cfg),
            cfg.ray_inference_cpus_per_worker,
            str(self.run_dir / "logs" / "inference"),
        )
        self.trainer_info = ray.get(init_refs)

    def _move_ports_if_taken(self, count: int) -> None:
        """Servers on this node: claim a free block of ports (``inference_base_port`` or the next free
        one), so that two runs on one machine, or another program on 8100, never collide."""
        import ray

        from telescope.core.cluster.claims import port_block
        from telescope.core.runtime.ray_group import bundle_ip

        here = ray.util.get_node_ip_address()
        if not any(bundle_ip(self.pools.inference, i) == here for i in range(count)):
            return  # servers on other nodes: their launch refuses a taken port (check_port_free)
        host, base = self.cfg.inference_host, self.cfg.inference_base_port
        first, claims = port_block(host or "0.0.0.0", base, count, {"run_dir": str(self.run_dir)})
        self._claims += claims
        if first != base:
            log.warning(
                "inference ports %d-%d are in use or held by another Telescope run: the servers listen "
                "on %d-%d instead",
                base,
                base + count - 1,
                first,
                first + count - 1,
            )
            self.cfg = self.cfg.model_copy(update={"inference_base_port": first})

    def fail(self, error: BaseException) -> None:
        """End the run with ``error`` now, from any thread (a run directory that cannot be written).

        ``train`` stops waiting for the orchestrator, cancels it (it shuts its groups down) and
        raises ``error``; the first error wins.
        """
        if self._failure is None:
            self._failure = error
        loop, abort = self._loop, self._abort
        if loop is not None and abort is not None and not loop.is_closed():
            loop.call_soon_threadsafe(abort.set)

    async def train(self, work_fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``work_fn`` (the driver passes ``assemble.train_session``: build the orchestrator around
        the started processes and run it) until it returns or ``fail`` ends it, watching the trainers."""
        self._loop, self._abort = asyncio.get_running_loop(), asyncio.Event()
        if self._failure is not None:
            raise self._failure
        work = asyncio.ensure_future(work_fn())
        abort = asyncio.ensure_future(self._abort.wait())
        watch = asyncio.ensure_future(self._watch_trainers())
        await asyncio.wait({work, abort}, return_when=asyncio.FIRST_COMPLETED)
        abort.cancel()
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        if self._failure is not None:
            raise self._failure
        work.result()

    def _watch_trainers(self) -> Awaitable[None]:
        """Supervise the trainer ranks by heartbeats (``supervision/heartbeat.py``): a dead rank, or a
        step overdue while a rank does not answer or is stuck, ends the training at once (``fail``)."""
        from telescope.core.runtime.supervision.heartbeat import TrainerWatch, recorded_step_seconds

        def snapshot() -> RunSnapshot | None:
            return self.orchestrator.snapshot() if self.orchestrator is not None else None

        watch = TrainerWatch(
            self.trainers, self.cfg, snapshot, lambda: recorded_step_seconds(self.run_dir), self.fail
        )
        return watch.run()

    def stop(self) -> None:
        """Stop servers first (their processes), then kill every actor and release the pools."""
        import ray

        try:
            if ray.is_initialized():
                self._stop_processes()
        finally:
            from telescope.core.cluster.claims import release_rendezvous_ports

            for held in self._claims:  # ports and the private-cluster mark, once everything stopped
                held.release()
            self._claims.clear()
            release_rendezvous_ports()  # the trainers' and weight-sync stores' (``node_free_port``)

    def _stop_processes(self) -> None:
        import ray

        from telescope.core.runtime.cluster import shutdown
        from telescope.core.runtime.supervision.heartbeat import TrainerHungError, kill_silent_ranks

        if isinstance(self._failure, TrainerHungError) and self._failure.silent:
            kill_silent_ranks(self._failure.silent)  # frozen: they cannot exit when ray.kill asks

        if self.servers is not None:
            try:
                ray.get([a.stop.remote() for a in self.servers.actors], timeout=30)
            except Exception as exc:  # noqa: BLE001 - continue tearing down
                log.warning("stopping inference servers: %s", exc)
        for actor in [*self.trainers, *(self.servers.actors if self.servers else [])]:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        shutdown(self.cfg, self.pools, started_here=self.started_here)
        os.environ.pop("TELESCOPE_RUN_DIR", None)
