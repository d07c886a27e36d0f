"""``run_training``: the whole run, end to end, with every process stopped however it ends."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.cluster.signals import sigterm_as_interrupt, teardown_signals
from telescope.core.config import TelescopeConfig
from telescope.core.errors import describe_failure
from telescope.core.health import HEALTH_PLUGIN
from telescope.core.health.sentinel import HealthSentinel
from telescope.core.observe import LoggerHub, build_logger_hub
from telescope.core.observe.stdio import tail_lines
from telescope.core.runtime.assemble import inference_engine, train_session
from telescope.core.runtime.rundir import RunDirLock, check_run_dir_free
from telescope.core.runtime.session import RunSession
from telescope.core.runtime.supervision.hookcalls import HookFailure, call_each
from telescope.core.runtime.supervision.preflight import check_supported
from telescope.core.runtime.supervision.recovery import RestartPlan
from telescope.core.runtime.supervision.rollback import health_rollback

if TYPE_CHECKING:
    import pluggy

    from telescope.core.inference.launcher import InferenceEngine
    from telescope.core.plugins import PluginSet
    from telescope.core.registry import Registry

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

    return cfg.model_copy(
        update={"model": resolve_model_path(cfg.model), "inference_engine": engine, "run_dir": str(run_dir)}
    )


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
    from telescope.core.cluster.gc_tuning import driver_gc
    from telescope.core.cluster.run_secret import ensure_run_secret
    from telescope.core.inference.auto import resolve_inference_engine, startup_summary

    # Before anything starts: Ray, the servers and the trainers inherit it (cluster.runtime_env).
    ensure_run_secret()
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
    health = HealthSentinel(wcfg, hook, fail=lambda err: sessions[-1].fail(err))  # for the whole run
    with registered(pset.pm, hub, LOGGER_HUB_PLUGIN), registered(pset.pm, health, HEALTH_PLUGIN):
        hub.start(wcfg, run_dir, resume.logger_ids if resume else None)
        session.run_id = str(hub.run_ids().get("local", {}).get("run_id", ""))
        session.logger_ids = hub.run_ids
        status, error = "failed", None
        try:
            hook.telescope_run_start(config=wcfg, run_dir=str(run_dir))
            if resume is not None:
                hook.telescope_run_info(
                    info={
                        "resume": {
                            "from_step": resume.step,
                            "checkpoint": str(resume.path),
                            "superseded": [str(p) for p in superseded],
                        }
                    }
                )
            summary = startup_summary(cfg, engine, why)  # once: run.json and telescope.log share it
            hook.telescope_run_info(
                info={
                    "setup": {
                        "inference_engine": engine,
                        "why": why,
                        "plugins": pset.names,
                        "summary": summary.line,
                        "notes": list(summary.notes),
                    }
                }
            )
            with sigterm_as_interrupt(), driver_gc():
                _train_recovering(sessions, hub, pset, inference_engine(wcfg, registry))
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


def _train_recovering(
    sessions: list[RunSession], hub: LoggerHub, pset: PluginSet, engine: InferenceEngine
) -> None:
    """Start and train the last session; after a trainer failure, again from the latest checkpoint
    (``max_run_restarts`` times; the same failure at the same step twice ends the run). ``engine``:
    the run's inference engine, for what its servers offer the run (traces, Prometheus metrics)."""
    from telescope.core.runtime.supervision.recovery import FailureSignature

    seen: set[FailureSignature] = set()
    restarts: list[dict[str, Any]] = []
    while True:
        session = sessions[-1]
        try:
            if len(sessions) == 1 and engine.exports_request_traces:  # a restart keeps the receiver
                _start_trace_receiver(hub, session)
            session.start()
            if len(sessions) == 1:
                _add_sources(hub, pset.pm.hook, sessions, engine)
            asyncio.run(session.train(functools.partial(train_session, session, pset)))
            return
        except Exception as exc:
            rollback = health_rollback(exc, session.cfg)  # a health finding's: its checkpoint, a lower LR
            failures = sum(not r.get("health_rollback") for r in restarts)
            plan = rollback.plan if rollback else _restart_plan(exc, session, seen, failures)
            if plan is None:
                raise
            point = plan.point
            restarts.append(
                {
                    "from_step": point.step,
                    "reason": plan.reason,
                    "checkpoint": str(point.path),
                    "time": time.time(),
                    "health_rollback": rollback is not None,
                }
            )
            session.stop()
            pset.pm.hook.telescope_run_info(info={"restarts": restarts})
            again = RunSession(
                rollback.cfg if rollback else session.cfg, session.plugins, session.registry, session.run_dir
            )
            again.resume, again.run_id, again.traces = point, session.run_id, session.traces
            again.logger_ids = session.logger_ids
            sessions.append(again)


def _restart_plan(exc: BaseException, session: RunSession, seen: set[Any], done: int) -> RestartPlan | None:
    """The checkpoint to restart from after ``exc``, or None when the run must end (raises a clearer
    error naming the dead trainer ranks when there are any)."""
    from telescope.core.config import ConfigError
    from telescope.core.observe.rundir.storage import StorageError
    from telescope.core.runtime.supervision.heartbeat import TrainerHungError
    from telescope.core.runtime.supervision.recovery import (
        dead_trainer_ranks,
        report_dead,
        restart_point,
        signature,
    )

    hung = isinstance(exc, TrainerHungError)  # a frozen or stuck rank heals like a dead one
    if isinstance(exc, ConfigError | StorageError) or not (hung or _from_a_worker(exc)):
        return None  # the driver's own failures (config, storage, code) do not heal by restarting
    step = session.current_step()
    dead = dead_trainer_ranks(session.trainers) if session.trainers and not hung else []
    died = report_dead(dead, step) if dead else None
    sig = signature(exc, step, dead)
    point = restart_point(session.cfg)
    limit = session.cfg.max_run_restarts
    why = (
        "no checkpoint to restart from"
        if point is None
        else f"max_run_restarts ({limit}) used up"
        if done >= limit
        else f"it failed the same way at step {step} before"
        if sig in seen
        else ""
    )
    if why:
        if done or point is not None:
            log.error("not restarting the run: %s", why)
        if died is not None:
            raise died from exc
        return None
    assert point is not None  # ``why`` says so when there is none
    seen.add(sig)
    reason = describe_failure(died or exc)
    log.warning(
        "%s; restarting the trainers and servers from checkpoint step %d (restart %d of max_run_restarts %d)",
        reason,
        point.step,
        done + 1,
        limit,
    )
    return RestartPlan(point, reason)


def _from_a_worker(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a Ray failure: a trainer or server process failed or died."""
    import ray

    from telescope.core.errors import exception_chain

    return any(isinstance(e, ray.exceptions.RayError) for e in exception_chain(exc))


def _add_sources(
    hub: LoggerHub, hook: pluggy.HookRelay, sessions: list[RunSession], engine: InferenceEngine
) -> None:
    from telescope.core.observe.samplers.torch_memory import RayDrainFetcher
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
    counts: dict[str, Any] = {
        k: session.trainer_info[0][k]
        for k in ("trainable_parameters", "total_parameters")
        if session.trainer_info and k in session.trainer_info[0]
    }
    hook.telescope_run_info(
        info={"torch_threads": torch_thread_info(session.trainer_info, session.servers), **counts}
    )
    hub.add_torch_memory_source(drain)
    if engine.serves_prometheus_metrics:
        hub.add_prometheus_scraper(dict(enumerate(session.servers.urls)))


def _start_trace_receiver(hub: LoggerHub, session: RunSession) -> None:
    """The OTLP receiver of vLLM's traces, listening before the servers start (they export from their
    first second; a receiver started after them refused every span sent until then), and the port it
    got (another when ``otlp_receiver_port`` is taken) in the config the servers are launched with."""
    session.traces = hub.add_otlp_receiver()
    if session.traces is not None and session.traces.port != session.cfg.otlp_receiver_port:
        session.cfg = session.cfg.model_copy(update={"otlp_receiver_port": session.traces.port})


def _end_run(
    pm: pluggy.PluginManager,
    hub: LoggerHub,
    session: RunSession,
    status: str,
    error: BaseException | None,
    run_dir: Path,
) -> BaseException | None:
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


def _stop_and_finish(
    pm: pluggy.PluginManager,
    hub: LoggerHub,
    session: RunSession,
    status: str,
    error: BaseException | None,
    failures: list[HookFailure],
    run_dir: Path,
) -> BaseException | None:
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


def _report_hook_failures(
    hub: LoggerHub, failures: list[HookFailure], status: str, run_dir: Path
) -> BaseException | None:
    """Log each plugin's failure and keep them in run.json; after a successful run, the first one
    becomes the run's failure (returned)."""
    from telescope.core.errors import stage_error

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
    from telescope.core.errors import root_cause
    from telescope.core.observe.hub import HUB_WARNING

    reason = describe_failure(error)
    # HUB_WARNING: the console does not repeat it (the CLI prints the same line once, in red)
    log.error("training failed: %s", reason, extra=HUB_WARNING)
    log.debug("training failed: traceback", exc_info=error)
    tail = log_tail(run_dir / "logs" / "telescope.log")
    return {"failure": {"reason": reason, "type": type(root_cause(error)).__name__, "log_tail": tail}}


def log_tail(path: Path, lines: int = 30) -> list[str]:
    """The last ``lines`` lines of ``path``, cleaned (empty when it cannot be read)."""
    return tail_lines(path, lines)
