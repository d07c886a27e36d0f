"""The processes Ray places: trainer ranks and inference servers.

Both receive the resolved config (as data) and the exact plugin list the driver loaded, so
every process runs the same components with the same settings.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.cluster.threads import Component
    from telescope.core.config import TelescopeConfig
    from telescope.core.registry import Registry
    from telescope.core.trainer import RankBatch

__all__ = ["InferenceServerWorker", "TrainerWorker", "torch_thread_info"]

logger = logging.getLogger(__name__)

#: How long a restart waits for the port of the server it replaces to close (its killed processes exiting).
RESTART_PORT_WAIT_S = 60.0


def _load(cfg_data: dict[str, Any], plugins: list[str]) -> tuple[TelescopeConfig, Registry]:
    from telescope.core.config import TelescopeConfig
    from telescope.core.plugins import load_plugins

    cfg = TelescopeConfig.model_validate(cfg_data)
    if cfg.debug:
        from telescope.core.observe.debuglog import enable_debug_logging

        enable_debug_logging()
    _, registry = load_plugins(only=plugins)
    return cfg, registry


def _set_threads(cfg: TelescopeConfig, component: Component) -> dict[str, Any]:
    """Set torch's intra-op threads by ``telescope.core.cluster.threads``; returns the choice."""
    import torch

    from telescope.core.cluster.threads import choose_torch_threads

    choice = choose_torch_threads(cfg, component)
    torch.set_num_threads(choice.threads)
    logger.info("%s torch threads: %d (%s)", component, choice.threads, choice.rule)
    return choice.to_dict()


def torch_thread_info(trainer_info: list[dict[str, Any]], servers: Any) -> dict[str, Any]:
    """The thread counts every trainer rank and server chose (the driver records them in run.json)."""
    import ray

    actors = servers.actors if servers is not None else []
    return {
        "trainer": [info.get("torch_threads") for info in trainer_info],
        "inference": ray.get([a.torch_threads.remote() for a in actors]),
    }


def _checkpoint_name(directory: str) -> str:
    """``step 8`` for ``.../step_8`` or its partial directory ``.../.step_8.partial-1f2e``."""
    import re

    found = re.search(r"step_(\d+)", os.path.basename(directory))
    return f"step {found.group(1)}" if found else os.path.basename(directory)


class TrainerWorker:
    """One trainer rank: the configured backend plus the sending end of the weight sync.

    Each method that works names its phase on ``self.phases``; ``heartbeat`` reports it from the
    Ray concurrency group ``HEALTH_GROUP`` (its own thread), so the driver hears from a rank in the
    middle of a step and notices one that stops answering (``supervision/heartbeat.py``).
    """

    def __init__(
        self,
        cfg_data: dict[str, Any],
        plugins: list[str],
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
    ) -> None:
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": "0",
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
        )
        self.cfg, registry = _load(cfg_data, plugins)
        self._threads = _set_threads(self.cfg, "trainer")
        self.rank = rank
        from telescope.core.runtime.supervision.heartbeat import PhaseClock

        self.phases = PhaseClock()
        from telescope.core.observe.samplers.torch_memory import TorchMemorySampler

        self._torch_memory = TorchMemorySampler.from_config(self.cfg, rank=rank).start()
        from telescope.core.runtime.supervision.faults import with_trainer_faults

        backend = registry.create(
            "trainer_backend",
            self.cfg.train_backend,
            self.cfg.train_backend_kwargs,
            cfg=self.cfg,
            registry=registry,
        )
        self.backend = with_trainer_faults(backend)
        self._sender: Any = None

    def init(self) -> dict[str, Any]:
        """Build model and optimizer (collective across ranks)."""
        with self.phases.phase("init"):
            return {**self.backend.init(), "torch_threads": self._threads}

    def heartbeat(self) -> dict[str, Any]:
        """What this rank is doing (``PhaseClock.beat``), its pid and node (called in ``HEALTH_GROUP``)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {**self.phases.beat(), "rank": self.rank, "pid": os.getpid(), "node_id": node}

    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def train_step(self, batch: RankBatch) -> dict[str, float]:
        """One training step on this rank's share of the batch (``batch.step`` is 0-based)."""
        with self.phases.phase(f"train_step (step {batch.step + 1})"):
            return dict(self.backend.train_step(batch))

    def drain_torch_memory(self) -> list[dict[str, Any]]:
        """Torch memory samples taken since the last drain (the driver logs them)."""
        return list(self._torch_memory.drain())

    def init_weight_sync(self, spec: dict[str, Any]) -> None:
        """Rank 0 joins the weight-sync group as the sender (blocks until every server joined)."""
        if self.rank != 0:
            return
        from telescope.core.weights.group import WeightSyncGroup
        from telescope.core.weights.sender import WeightSender
        from telescope.core.weights.settings import GroupSpec, WeightSyncSettings

        with self.phases.phase("init_weight_sync"):
            group = WeightSyncGroup(GroupSpec(**spec), rank=0)
            self._sender = WeightSender(group, WeightSyncSettings.from_config(self.cfg))

    def send_weights(self, version: int) -> dict[str, Any]:
        """Stream the weights to every server (rank 0 sends; the other ranks join the gathers)."""
        with self.phases.phase(f"send_weights (version {version})"):
            return self._send_weights(version)

    def _send_weights(self, version: int) -> dict[str, Any]:
        import time

        start = time.perf_counter()
        weights = self.backend.iter_weights_for_inference()
        if self.rank != 0:
            for _ in weights:
                pass
            return {}
        report = self._sender.send(weights, version)
        return {
            "fingerprints": report.fingerprints,
            "num_tensors": report.num_tensors,
            "num_bytes": report.num_bytes,
            "seconds": time.perf_counter() - start,
        }

    def save_checkpoint(self, directory: str, training_state: bool = True) -> None:
        """Write this rank's part of a checkpoint (collective)."""
        with self.phases.phase(f"save_checkpoint ({_checkpoint_name(directory)})"):
            self.backend.save_checkpoint(directory, training_state=training_state)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Restore a checkpoint on this rank (collective)."""
        with self.phases.phase(f"load_checkpoint ({_checkpoint_name(directory)})"):
            return dict(self.backend.load_checkpoint(directory) or {})


class InferenceServerWorker:
    """Holds one inference server process for the lifetime of the run."""

    def __init__(
        self, cfg_data: dict[str, Any], plugins: list[str], index: int, engine: str, log_dir: str
    ) -> None:
        self.cfg, registry = _load(cfg_data, plugins)
        self.index = index
        self.engine_name = engine
        self.engine = registry.create(
            "inference_engine", engine, self.cfg.inference_engine_kwargs, cfg=self.cfg
        )
        self.log_dir = log_dir
        self.server: Any = None

    def start(self) -> dict[str, str]:
        """Launch the server on a free port and wait until it is healthy; returns its URL and node."""
        import ray

        # Server i listens on inference_host:inference_base_port + i (engine.launch's default).
        self.server = self.engine.launch(self.index, log_dir=self.log_dir)
        return {"url": self.server.url, "node_ip": str(ray.util.get_node_ip_address())}

    def torch_threads(self) -> dict[str, Any] | None:
        """The threads the server process uses (transformers engine), or None for other engines."""
        if self.engine_name != "transformers":
            return None
        from telescope.core.inference.transformers_engine.server import server_threads

        return server_threads(self.cfg, self.engine.kwargs).to_dict()

    def log_tail(self) -> str:
        return self.server.log_tail() if self.server is not None else ""

    def restart(self) -> dict[str, str]:
        """Start the server again after it died (same port); returns ``start()``'s answer."""
        if self.server is not None:
            from telescope.core.inference.launcher import wait_port_free

            url = self.server.url
            self.server.stop(grace_s=2.0)  # reaps what is left of the dead process group
            self.server = None
            # its killed processes may still be exiting (a frozen vLLM server's did): the port frees then
            wait_port_free(url, timeout_s=RESTART_PORT_WAIT_S)
        return self.start()

    def where(self) -> str:
        """``pid 4321 on node 10.0.0.5, http://10.0.0.5:8100`` (the healer's diagnosis of a frozen server)."""
        import ray

        if self.server is None:
            return f"not running, on node {ray.util.get_node_ip_address()}"
        return f"pid {self.server.process.pid} on node {ray.util.get_node_ip_address()}, {self.server.url}"

    def server_running(self) -> bool:
        """Whether the server process still exists (a frozen one does; a crashed one has exited)."""
        return self.server is not None and self.server.process.poll() is None

    def kill_server(self) -> None:
        """SIGKILL the server's process group: a frozen server before its restart (a stopped process
        cannot exit when asked), fault injection (``TELESCOPE_FAULTS=server_kill@N``)."""
        import signal

        if self.server is not None:
            try:
                os.killpg(self.server.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the whole group is gone already (a dead server): nothing to kill

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace_s=5.0)
            self.server = None
