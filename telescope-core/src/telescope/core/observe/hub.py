"""``LoggerHub``: the built-in plugin that fans a run's hook calls out to every logger.

For a run's lifetime the driver registers it on the plugin manager (``core.logger_hub``); it
implements the run hooks (``hookspecs.py``) like any other plugin and hands each call to the
enabled ``Logger`` components. Its ``log_*`` methods are for code that writes a run directory
without a run (tests, the dashboard's fixtures).

A logger that raises is counted (``failures``) and warned about once per (logger, method);
the run goes on. A ``required`` logger (the run directory) that fails stops the run: in
``start`` by raising ``LoggerStartError``; in any later write by a ``StorageError`` handed
to ``on_fatal`` (the driver ends the run with it) or, without one, raised to the caller.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core import hookimpl
from telescope.core.observe.base import Logger
from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent, eval_event
from telescope.core.observe.rundir.storage import StorageError, describe_os_error

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.observe.samplers.otlp import OtlpReceiver

__all__ = ["FINISH_STATUSES", "LoggerHub", "LoggerStartError"]

_log = logging.getLogger("telescope.observe")

FINISH_STATUSES = ("finished", "failed", "interrupted")

#: ``extra`` of log records the hub already handed to every logger's ``warn`` (so a logger
#: that also watches Python logging, like the console, does not show them twice).
HUB_WARNING = {"telescope_hub_warning": True}


def tick_seconds(cfg: TelescopeConfig) -> float:
    """Tick period: a quarter of the shortest buffering interval, kept within 0.05..0.5 s."""
    shortest = min(float(cfg.metrics_logger_interval_seconds), float(cfg.event_upload_interval_seconds))
    return min(max(shortest / 4, 0.05), 0.5)


class LoggerStartError(RuntimeError):
    """A required logger (the local run directory) could not start."""


class LoggerHub:
    """Fan-out to ``loggers``; every method is safe to call from any thread."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers: list[Logger] = list(loggers)
        self.failures: Counter[tuple[str, str]] = Counter()
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._sampler: Any = None
        self._scrapers: list[Any] = []
        self._threads: list[Any] = []
        self._stopped: set[int] = set()
        self._cfg: TelescopeConfig | None = None
        """The run's config once ``start`` ran (before it, the sources use the defaults)."""
        self._finished = False
        #: Enabled loggers that could not be built here, ``{name: reason}`` (warned at start).
        self.skipped: dict[str, str] = {}
        #: Called once, from the failing call's thread, when a required logger cannot write.
        self.on_fatal: Callable[[StorageError], None] | None = None
        #: The first write failure of a required logger (None while every write succeeds).
        self.fatal: StorageError | None = None
        #: Where the samples of the hub's sources go: its loggers, or in a run the
        #: ``telescope_system_sample`` hook (which reaches the loggers through the hub's plugin).
        self.report_system: Callable[[dict[str, Any]], None] = self.log_system

    def _call(self, method: str, *args: Any) -> None:
        for lg in list(self.loggers):
            try:
                getattr(lg, method)(*args)
            except Exception as exc:  # noqa: BLE001 - an optional logger must never crash the run
                if lg.required and method != "finish":
                    self._required_failed(lg, method, exc)
                else:
                    self._record_failure(lg, method, exc)

    def _required_failed(self, lg: Logger, method: str, exc: Exception) -> None:
        """The run directory cannot be written: stop the run (``on_fatal``), or raise without one."""
        with self._lock:
            self.failures[(lg.name, method)] += 1
            first = self.fatal is None
            fatal = self.fatal or (
                exc
                if isinstance(exc, StorageError)
                else StorageError(
                    f"logger '{lg.name}' could not write the run directory ({method}): {describe_os_error(exc)}"
                )
            )
            self.fatal = fatal
        if self.on_fatal is None:
            raise fatal from exc
        if first:
            _log.debug("run directory write failed", exc_info=exc)
            self.on_fatal(fatal)

    def _record_failure(self, lg: Logger, method: str, exc: BaseException) -> None:
        key = (lg.name, method)
        with self._lock:
            self.failures[key] += 1
            first = key not in self._warned
            self._warned.add(key)
        if first:
            msg = (
                f"logger '{lg.name}' failed in {method}: {type(exc).__name__}: {exc} "
                "(the run continues; later failures of this call are counted, not repeated)"
            )
            _log.warning(msg, exc_info=exc, extra=HUB_WARNING)
            for other in self.loggers:
                if other is not lg:
                    with contextlib.suppress(Exception):
                        other.warn(msg)

    # --- lifecycle -------------------------------------------------------------------
    def start(
        self,
        cfg: TelescopeConfig,
        run_dir: str | Path,
        resume_ids: dict[str, dict[str, Any]] | None = None,
        *,
        system_metrics: bool = True,
        ticker: bool = True,
    ) -> None:
        """Start every logger; then the system-metrics sampler and the tick thread (``cfg`` intervals).

        Args:
            resume_ids: ``run_ids()`` of the run being resumed (``{logger name: ids}``).
            system_metrics: sample CPU/memory (and GPUs when ``cfg.track_gpu_events``).
            ticker: call every logger's ``tick`` every ``tick_seconds(cfg)`` (buffered files and
                uploads go out at their intervals); off, they go out at ``finish``.
        """
        self._cfg = cfg
        run_dir = Path(run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LoggerStartError(f"logger 'local' could not start: cannot create {run_dir}: {exc}") from exc
        resume_ids = resume_ids or {}
        started: list[Logger] = []
        for lg in self.loggers:
            try:
                lg.start(cfg, run_dir, resume_ids.get(lg.name))
            except Exception as exc:
                if lg.required:
                    raise LoggerStartError(f"logger '{lg.name}' could not start in {run_dir}: {exc}") from exc
                self._record_failure(lg, "start", exc)
                continue
            started.append(lg)
        self.loggers = started
        for name, reason in self.skipped.items():
            self.warn(f"logger '{name}' is off for this run: {reason}")
        if system_metrics:
            from telescope.core.observe.samplers.system import SystemMetricsSampler

            self._sampler = SystemMetricsSampler(
                self._system_sample,
                interval_s=float(cfg.system_metrics_collection_interval_seconds),
                gpus=bool(cfg.track_gpu_events),
            )
            self._sampler.start()
        if ticker:
            from telescope.core.observe.periodic import PeriodicThread

            self._start_thread(PeriodicThread(self.tick, tick_seconds(cfg), "telescope-logger-tick"))

    def _system_sample(self, sample: dict[str, Any]) -> None:
        self.report_system(sample)

    def _started_config(self) -> TelescopeConfig:
        """The config ``start`` was given: sources added later read their intervals from it."""
        if self._cfg is None:
            raise RuntimeError("LoggerHub.start(cfg, run_dir) must come before adding a metrics source")
        return self._cfg

    def _start_thread(self, thread: Any) -> None:
        thread.start()
        self._threads.append(thread)

    def tick(self) -> None:
        """Let every logger hand over what is due (called by the tick thread)."""
        self._call("tick")

    def add_torch_memory_source(self, fetch: Any, interval_s: float | None = None) -> None:
        """Every ``ray_torch_memory_drain_interval_seconds``, log the samples ``fetch()`` returns.

        Args:
            fetch: returns the torch-memory samples taken since its last call, e.g.
                ``telescope.core.observe.samplers.torch_memory.RayDrainFetcher(trainer_actors)``.
            interval_s: overrides the config's drain interval.
        """
        from telescope.core.observe.samplers.torch_memory import TorchMemoryDrainer

        if interval_s is None:
            interval_s = self._started_config().ray_torch_memory_drain_interval_seconds
        self._start_thread(TorchMemoryDrainer(fetch, self._system_sample, interval_s))

    def add_prometheus_scraper(self, urls: dict[int, str], interval_s: float | None = None) -> None:
        """Scrape each inference server's ``/metrics`` (vLLM) into ``log_system`` until finish.

        Args:
            urls: ``{server index: base URL}``, e.g. ``{0: "http://10.0.0.2:8000"}``.
            interval_s: overrides the config's ``system_metrics_collection_interval_seconds``.
        """
        from telescope.core.observe.samplers.prometheus import PrometheusScraper

        if interval_s is None:
            interval_s = self._started_config().system_metrics_collection_interval_seconds
        scraper = PrometheusScraper(urls, self._system_sample, interval_s=interval_s)
        scraper.start()
        self._scrapers.append(scraper)

    def add_otlp_receiver(self) -> OtlpReceiver | None:
        """Start the OTLP trace receiver for vLLM on ``otlp_receiver_port``, stopped with the other sources.

        Returns the ``OtlpReceiver`` (look finished requests up with ``receiver.timings(id)``),
        or None when ``enable_vllm_tracing`` is off.
        """
        from telescope.core.observe.samplers.otlp import OtlpReceiver

        if self._cfg is None or not self._cfg.enable_vllm_tracing:  # not started, or tracing off
            return None
        receiver = OtlpReceiver.from_config(self._cfg)
        receiver.start()
        self._scrapers.append(receiver)
        return receiver

    def finish(self, status: str = "finished") -> None:
        """Stop the sampler and finish every logger (idempotent)."""
        if status not in FINISH_STATUSES:
            raise ValueError(
                f"finish status {status!r} is not valid: use one of {', '.join(FINISH_STATUSES)}"
            )
        if self._finished:
            return
        self._finished = True
        self.stop_sources()
        self._call("finish", status)

    def stop_sources(self) -> None:
        """Stop the samplers, scrapers, OTLP receiver, torch-memory drains and the tick thread (idempotent).

        Call it before stopping the processes they read from (a torch-memory drain makes one
        last call to the workers); ``finish`` calls it too. Logging still works afterwards.
        """
        for source in [self._sampler, *self._scrapers, *self._threads]:
            if source is not None and id(source) not in self._stopped:
                self._stopped.add(id(source))
                source.stop()

    def run_ids(self) -> dict[str, dict[str, Any]]:
        """``{logger name: ids}`` to store in the checkpoint and pass back to ``start``."""
        out: dict[str, dict[str, Any]] = {}
        for lg in self.loggers:
            try:
                ids = lg.run_ids()
            except Exception as exc:  # noqa: BLE001
                self._record_failure(lg, "run_ids", exc)
                continue
            if ids:
                out[lg.name] = ids
        return out

    # --- records ---------------------------------------------------------------------
    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._call("log_step", int(step), dict(metrics))

    def log_rollouts(self, step: int, rows: Sequence[RolloutRecord | dict[str, Any]]) -> None:
        records = [r if isinstance(r, RolloutRecord) else RolloutRecord.from_dict(r) for r in rows]
        self._call("log_rollouts", int(step), records)

    def log_events(self, events: Sequence[TimelineEvent]) -> None:
        self._call("log_events", list(events))

    def event(self, type: str, phase: str = "instant", **fields: Any) -> None:
        """Emit one ``TimelineEvent(type, phase, **fields)`` now."""
        self.log_events([TimelineEvent(type=type, phase=phase, **fields)])

    @contextlib.contextmanager
    def span(self, type: str, **fields: Any) -> Iterator[None]:
        """Emit ``start`` now and ``end`` (with ``attrs.duration_s``) when the block exits."""
        t0 = time.time()
        self.event(type, "start", time=t0, **fields)
        try:
            yield
        finally:
            attrs = dict(fields.pop("attrs", {}) or {})
            attrs["duration_s"] = time.time() - t0
            self.event(type, "end", attrs=attrs, **fields)

    def log_system(self, sample: dict[str, Any]) -> None:
        self._call("log_system", sample)

    def log_info(self, info: dict[str, Any]) -> None:
        self._call("log_info", dict(info))

    def log_eval(
        self, step: int, name: str, metrics: dict[str, float], rows: Sequence[dict[str, Any]] = ()
    ) -> None:
        """One eval's scores (``{metric: value}``) and per-sample ``rows`` at trainer ``step``.

        Also puts an ``eval`` instant event on the timeline: ``name``, ``step`` and
        ``attrs = {"scores": metrics, "samples": len(rows)}``.
        """
        rows = [dict(r) for r in rows]
        self.telescope_eval_end(step, name, metrics, rows)
        self.log_events([eval_event(step, name, metrics, len(rows))])

    def warn(self, message: str) -> None:
        """Show ``message`` on the console and record it in the run's log."""
        _log.warning(message, extra=HUB_WARNING)
        self._call("warn", message)

    # --- run hooks: for a run's lifetime the hub is the plugin ``core.logger_hub`` ----------
    @hookimpl
    def telescope_run_info(self, info: dict[str, Any]) -> None:
        self.log_info(info)

    @hookimpl
    def telescope_events(self, events: list[TimelineEvent]) -> None:
        self.log_events(events)

    @hookimpl
    def telescope_step_end(self, step: int, metrics: dict[str, float], rollouts: list[RolloutRecord]) -> None:
        self.log_rollouts(step, rollouts)
        self.log_step(step, metrics)

    @hookimpl
    def telescope_eval_end(
        self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]
    ) -> None:
        """Hands the result to every logger; its ``eval`` event comes through ``telescope_events``."""
        self._call("log_eval", int(step), str(name), dict(metrics), [dict(r) for r in rows])

    @hookimpl
    def telescope_system_sample(self, sample: dict[str, Any]) -> None:
        self.log_system(sample)

    @hookimpl
    def telescope_warning(self, message: str) -> None:
        self.warn(message)

    @hookimpl
    def telescope_run_end(self, status: str) -> None:
        self.finish("finished" if status == "completed" else status)
