"""``run_training``: the whole run, end to end, with every process stopped however it ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.config import TelescopeConfig
from telescope.core.observe import LoggerHub, build_logger_hub
from telescope.core.observe.stdio import tail_lines
from telescope.core.runtime.errors import describe_failure
from telescope.core.runtime.hookcalls import HookFailure, call_each
from telescope.core.runtime.preflight import check_supported
from telescope.core.runtime.recovery import RestartPlan
from telescope.core.runtime.rundir import RunDirLock, check_run_dir_free
from telescope.core.runtime.signals import route_sigterm_to_interrupt, sigterm_as_interrupt, teardown_signals

if TYPE_CHECKING:
    import pluggy

    from telescope.core.observe.otlp import OtlpReceiver
    from telescope.core.plugins import PluginSet
    from telescope.core.registry import Registry
    from telescope.core.runtime.checkpointing import ResumePoint
    from telescope.core.runtime.orchestrator import Orchestrator

__all__ = ["LOGGER_HUB_PLUGIN", "run_training"]

#: The plugin name of a run's ``LoggerHub`` while the run is on.
LOGGER_HUB_PLUGIN = "core.logger_hub"

log = logging.getLogger("telescope.runtime")


def prepare_run_dir(cfg: TelescopeConfig) -> Path:
    """Create the run directory (the ``local`` logger writes config.yaml and the records into it)."""
    run_dir = Path(cfg.resolved_run_dir).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    return run_dir


def worker_config(cfg: TelescopeConfig, engine: str, run_dir: Path) -> TelescopeConfig:
    """The config every process receives: the model path resolved once, the engine decided once."""
    from telescope.core.models.tiny import resolve_model_path

    return cfg.model_copy(update={"model": resolve_model_path(cfg.model), "inference_engine": engine,
                                  "run_dir": str(run_dir)})  # fmt: skip


def run_training(cfg: TelescopeConfig, pset: PluginSet, registry: Registry) -> int:
    """Train ``cfg`` to completion; returns the process exit code (0 on success).

    The run reports through ``pset``'s run hooks only (``hookspecs.py``); the run's loggers
    are the plugin ``core.logger_hub`` on them while it runs. The run directory is locked for
    the whole run and must be empty unless resuming or ``overwrite`` is set
    (``telescope.core.runtime.rundir``).
    """
    check_supported(cfg)
    with RunDirLock(Path(cfg.resolved_run_dir).resolve()) as lock:
        resuming = cfg.resume_from_checkpoint is not False
        check_run_dir_free(lock.run_dir, resume=resuming, overwrite=cfg.overwrite)
        return _run_in(cfg, pset, registry)


def _run_in(cfg: TelescopeConfig, pset: PluginSet, registry: Registry) -> int:
    """The run, once its run directory is locked and checked."""
    from telescope.core.inference.auto import resolve_inference_engine, startup_summary
    from telescope.core.runtime.checkpointing import find_resume_point, supersede_later_checkpoints

    resume = find_resume_point(cfg)
    superseded = supersede_later_checkpoints(cfg, resume) if resume is not None else []
    run_dir = prepare_run_dir(cfg)
    engine, why = resolve_inference_engine(cfg.inference_engine)
    log.info(why)
    wcfg = worker_config(cfg, engine, run_dir)
    session = RunSession(wcfg, pset.names, registry, run_dir)
    session.resume = resume
    sessions = [session]  # a trainer failure replaces the session (recovery from a checkpoint)
    hub = build_logger_hub(wcfg, registry)
    # a run directory that cannot be written ends the run (the current session: restarts replace it)
    hub.on_fatal = lambda err: sessions[-1].fail(err)
    hook = pset.pm.hook
    hub.report_system = lambda sample: hook.telescope_system_sample(sample=sample)
    with registered(pset.pm, hub, LOGGER_HUB_PLUGIN):
        hub.start(wcfg, run_dir, resume.logger_ids if resume else None)
        session.run_id = str(hub.run_ids().get("local", {}).get("run_id", ""))
        session.logger_ids = hub.run_ids
        status, error = "failed", None
        try:
            hook.telescope_run_start(config=wcfg, run_dir=str(run_dir))
            if resume is not None:
                hook.telescope_run_info(info={"resume": {"from_step": resume.step, "checkpoint": str(resume.path),
                                                         "superseded": [str(p) for p in superseded]}})  # fmt: skip
            summary = startup_summary(cfg, engine, why)  # once: run.json and telescope.log share it
            hook.telescope_run_info(info={"setup": {"inference_engine": engine, "why": why, "plugins": pset.names,
                                                    "summary": summary.line, "notes": list(summary.notes)}})  # fmt: skip
            with sigterm_as_interrupt():
                _train_recovering(sessions, hub, pset, engine)
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            with teardown_signals():
                ending = _end_run(pset.pm, hub, sessions[-1], status, error, run_dir)
        if ending is not None:  # the run succeeded, then a plugin failed at its end
            raise ending
    return 0


@contextlib.contextmanager
def registered(pm: pluggy.PluginManager, plugin: object, name: str) -> Iterator[None]:
    """``plugin`` on ``pm``'s hooks for the block's duration."""
    pm.register(plugin, name=name)
    try:
        yield
    finally:
        pm.unregister(plugin)


def _train_recovering(sessions: list[RunSession], hub: LoggerHub, pset: PluginSet, engine: str) -> None:
    """Start and train the last session; after a trainer failure, again from the latest checkpoint
    (``max_run_restarts`` times; the same failure at the same step twice ends the run)."""
    from telescope.core.runtime.recovery import FailureSignature

    seen: set[FailureSignature] = set()
    restarts: list[dict[str, Any]] = []
    while True:
        session = sessions[-1]
        try:
            session.start()
            if len(sessions) == 1:
                _add_sources(hub, pset.pm.hook, sessions, engine)
            asyncio.run(session.train(pset))
            return
        except Exception as exc:
            plan = _restart_plan(exc, session, seen, len(restarts))
            if plan is None:
                raise
            point = plan.point
            restarts.append({"from_step": point.step, "reason": plan.reason, "checkpoint": str(point.path),
                             "time": time.time()})  # fmt: skip
            session.stop()
            pset.pm.hook.telescope_run_info(info={"restarts": restarts})
            again = RunSession(session.cfg, session.plugins, session.registry, session.run_dir)
            again.resume, again.run_id, again.traces = point, session.run_id, session.traces
            again.logger_ids = session.logger_ids
            sessions.append(again)


def _restart_plan(exc: BaseException, session: RunSession, seen: set[Any], done: int) -> RestartPlan | None:
    """The checkpoint to restart from after ``exc``, or None when the run must end (raises a clearer
    error naming the dead trainer ranks when there are any)."""
    from telescope.core.config import ConfigError
    from telescope.core.observe.storage import StorageError
    from telescope.core.runtime.recovery import dead_trainer_ranks, report_dead, restart_point, signature

    if isinstance(exc, ConfigError | StorageError) or not _from_a_worker(exc):
        return None  # the driver's own failures (config, storage, code) do not heal by restarting
    step = session.current_step()
    dead = dead_trainer_ranks(session.trainers) if session.trainers else []
    died = report_dead(dead, step) if dead else None
    sig = signature(exc, step, dead)
    point = restart_point(session.cfg)
    limit = session.cfg.max_run_restarts
    why = ("no checkpoint to restart from" if point is None else f"max_run_restarts ({limit}) used up"
           if done >= limit else f"it failed the same way at step {step} before" if sig in seen else "")  # fmt: skip
    if why:
        if done or point is not None:
            log.error("not restarting the run: %s", why)
        if died is not None:
            raise died from exc
        return None
    assert point is not None  # ``why`` says so when there is none
    seen.add(sig)
    reason = describe_failure(died or exc)
    log.warning("%s; restarting the trainers and servers from checkpoint step %d (restart %d of max_run_restarts "
                "%d)", reason, point.step, done + 1, limit)  # fmt: skip
    return RestartPlan(point, reason)


def _from_a_worker(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a Ray failure: a trainer or server process failed or died."""
    import ray

    from telescope.core.runtime.errors import exception_chain

    return any(isinstance(e, ray.exceptions.RayError) for e in exception_chain(exc))


def _add_sources(hub: LoggerHub, hook: pluggy.HookRelay, sessions: list[RunSession], engine: str) -> None:
    from telescope.core.observe.torch_memory import RayDrainFetcher
    from telescope.core.runtime.workers import torch_thread_info

    fetchers: dict[int, RayDrainFetcher] = {}

    def drain() -> list[dict[str, Any]]:  # the current trainers (a restart starts new ones)
        trainers = sessions[-1].trainers
        if not sessions[-1].trainer_info:  # not started yet (a restart is under way)
            return []
        if id(trainers) not in fetchers:
            fetchers.clear()
            fetchers[id(trainers)] = RayDrainFetcher(trainers)
        return fetchers[id(trainers)]()

    session = sessions[-1]
    counts: dict[str, Any] = {k: session.trainer_info[0][k] for k in ("trainable_parameters", "total_parameters")
              if session.trainer_info and k in session.trainer_info[0]}  # fmt: skip
    hook.telescope_run_info(
        info={"torch_threads": torch_thread_info(session.trainer_info, session.servers), **counts}
    )
    hub.add_torch_memory_source(drain)
    if engine == "vllm":  # Prometheus /metrics and OTLP traces exist on vLLM servers only
        hub.add_prometheus_scraper(dict(enumerate(session.servers.urls)))
        session.traces = hub.add_otlp_receiver()


def _end_run(pm: pluggy.PluginManager, hub: LoggerHub, session: RunSession, status: str,
             error: BaseException | None, run_dir: Path) -> BaseException | None:  # fmt: skip
    """Stop every process, then end the run (the hub closes the run directory with its final status).

    A plugin raising on the way is reported naming the hook and the plugin; it never replaces
    the run's own ``error``, and the other plugins are still called. A run that succeeded ends
    failed instead: the error it ends with is returned, for the caller to raise.
    """
    hub.stop_sources()  # the last drain happens before the actors are killed
    failures: list[HookFailure] = []
    try:
        if error is not None:
            failures += call_each(pm, "telescope_run_info", {"info": _failure_info(error, run_dir)})
    finally:
        ending = _stop_and_finish(pm, hub, session, status, error, failures, run_dir)
    return ending


def _stop_and_finish(pm: pluggy.PluginManager, hub: LoggerHub, session: RunSession, status: str,
                     error: BaseException | None, failures: list[HookFailure], run_dir: Path) -> BaseException | None:  # fmt: skip
    """Stop the workers, then telescope_run_end, then the hub, each even when the one before raised."""
    try:
        session.stop()
    finally:
        end = {"status": status, "error": error}
        failures = failures + call_each(pm, "telescope_run_end", end, skip={LOGGER_HUB_PLUGIN})
        ending = None
        try:
            if failures:
                ending = _report_hook_failures(hub, failures, status, run_dir)
        finally:
            hub.finish("failed" if ending is not None else "finished" if status == "completed" else status)
    return ending


def _report_hook_failures(hub: LoggerHub, failures: list[HookFailure], status: str,
                          run_dir: Path) -> BaseException | None:  # fmt: skip
    """Log each plugin's failure and keep them in run.json; after a successful run, the first one
    becomes the run's failure (returned)."""
    from telescope.core.runtime.liveness import stage_error

    hub.log_info({"hook_failures": [f.record() for f in failures]})
    if status != "completed":
        for failure in failures:  # the run's own error stays its reported cause (and the last ERROR line)
            log.warning("%s (after the run had %s)", failure.describe(), status)
            log.info("%s: traceback", failure.describe(), exc_info=failure.error)
        return None
    first = failures[0]
    ending = stage_error(f"the {first.hook} hook of plugin {first.plugin!r}", first.error)
    for failure in failures[1:]:
        log.error("%s", failure.describe())
    hub.log_info(_failure_info(ending, run_dir))  # the other plugins heard 'completed' already
    return ending


def _failure_info(error: BaseException, run_dir: Path) -> dict[str, Any]:
    """The one-line reason into logs/telescope.log, the traceback into the detailed log; returns both
    for run.json (``telescope_run_info``)."""
    from telescope.core.observe.hub import HUB_WARNING
    from telescope.core.runtime.errors import root_cause

    reason = describe_failure(error)
    # HUB_WARNING: the console does not repeat it (the CLI prints the same line once, in red)
    log.error("training failed: %s", reason, extra=HUB_WARNING)
    log.debug("training failed: traceback", exc_info=error)
    tail = log_tail(run_dir / "logs" / "telescope.log")
    return {"failure": {"reason": reason, "type": type(root_cause(error)).__name__, "log_tail": tail}}


def log_tail(path: Path, lines: int = 30) -> list[str]:
    """The last ``lines`` lines of ``path``, cleaned (empty when it cannot be read)."""
    return tail_lines(path, lines)


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
        self.pools = reserve_pools(self.cfg, num_servers(self.cfg), use_gpus, self.run_id)
        self._move_ports_if_taken(num_servers(self.cfg))
        cfg, data = self.cfg, self.cfg.to_dict()
        self.trainers = start_trainers(data, self.plugins, self.pools, cfg.trainer_num_workers,
                                       cfg.ray_trainer_cpus_per_worker)  # fmt: skip
        init_refs = [t.init.remote() for t in self.trainers]
        self.servers = start_servers(data, self.plugins, self.pools, cfg.inference_engine, num_servers(cfg),
                                     cfg.ray_inference_cpus_per_worker, str(self.run_dir / "logs" / "inference"))  # fmt: skip
        self.trainer_info = ray.get(init_refs)

    def _move_ports_if_taken(self, count: int) -> None:
        """Servers on this node: claim a free block of ports (``inference_base_port`` or the next free
        one), so that two runs on one machine, or another program on 8100, never collide."""
        import ray

        from telescope.core.runtime.claims import port_block
        from telescope.core.runtime.ray_group import bundle_ip

        here = ray.util.get_node_ip_address()
        if not any(bundle_ip(self.pools.inference, i) == here for i in range(count)):
            return  # servers on other nodes: their launch refuses a taken port (check_port_free)
        host, base = self.cfg.inference_host, self.cfg.inference_base_port
        first, claims = port_block(host or "0.0.0.0", base, count, {"run_dir": str(self.run_dir)})
        self._claims += claims
        if first != base:
            log.warning("inference ports %d-%d are in use or held by another Telescope run: the servers listen "
                        "on %d-%d instead", base, base + count - 1, first, first + count - 1)  # fmt: skip
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

    async def train(self, pset: PluginSet) -> None:
        """Build the orchestrator around the started processes and run it (until done or ``fail``)."""
        self._loop, self._abort = asyncio.get_running_loop(), asyncio.Event()
        if self._failure is not None:
            raise self._failure
        work = asyncio.ensure_future(self._train(pset))
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

    async def _watch_trainers(self, interval_s: float = 2.0) -> None:
        """Supervise the trainer ranks: a dead one ends the training at once (``fail``), whatever the
        orchestrator is waiting for. One liveness call per rank is in flight at a time (a rank busy in
        a step answers after it)."""
        import ray

        pending: dict[int, Any] = {}
        while True:
            for rank, actor in enumerate(self.trainers):
                pending.setdefault(rank, actor.node_ip.remote())
            ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
            for rank, ref in list(pending.items()):
                if ref not in ready:
                    continue
                del pending[rank]
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self.fail(exc)
                    return
            await asyncio.sleep(interval_s)

    async def _train(self, pset: PluginSet) -> None:
        from telescope.core.runtime.assemble import (
            add_checkpoints_and_evals,
            build_orchestrator,
            close_environments,
        )

        orchestrator, clients = await build_orchestrator(self, pset.pm.hook)
        self.orchestrator = orchestrator
        evals = None
        try:
            evals = await add_checkpoints_and_evals(orchestrator, self, self.logger_ids)
            if evals is not None:
                await evals.before_training(resumed=self.resume is not None)
            await orchestrator.run()
            if evals is not None:
                await evals.after_training(orchestrator)
        finally:
            if evals is not None:
                await evals.close()
            await close_environments(orchestrator)
            for client in clients:
                await client.close()

    def stop(self) -> None:
        """Stop servers first (their processes), then kill every actor and release the pools."""
        import ray

        try:
            if ray.is_initialized():
                self._stop_processes()
        finally:
            from telescope.core.runtime.claims import release_rendezvous_ports

            for held in self._claims:  # ports and the private-cluster mark, once everything stopped
                held.release()
            self._claims.clear()
            release_rendezvous_ports()  # the trainers' and weight-sync stores' (``node_free_port``)

    def _stop_processes(self) -> None:
        import ray

        from telescope.core.runtime.cluster import shutdown

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
