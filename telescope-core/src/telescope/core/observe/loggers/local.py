"""``local`` logger: the run directory, always on (layout in ``docs/run-directory.md``)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from telescope.core.observe.base import Logger
from telescope.core.observe.logfilter import shared_repeat_filter
from telescope.core.observe.loggers.progress import StepProgress
from telescope.core.observe.periodic import IntervalBuffer, IntervalGate
from telescope.core.observe.rundir.blocks import EventBlocks, StepBlocks
from telescope.core.observe.rundir.jsonl import JsonlWriter
from telescope.core.observe.rundir.layout import (
    CONFIG_FILE,
    EVAL_METRICS_FILE,
    EVAL_SAMPLES_FILE,
    EVENTS_DIR,
    LOGS_DIR,
    METRICS_FILE,
    ROLLOUTS_DIR,
    RUN_FILE,
    SYSTEM_FILE,
    config_to_dict,
    write_json_atomic,
)
from telescope.core.observe.rundir.reader import read_run_meta
from telescope.core.observe.rundir.records import SCHEMA_VERSION, RolloutRecord, TimelineEvent
from telescope.core.observe.rundir.storage import StorageError, describe_os_error
from telescope.core.observe.stdio import STDOUT_LOG_NAME, StdioCapture

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["LocalLogger"]

#: The logger name of the step lines and the start-up summary in telescope.log.
PROGRESS_LOGGER = "telescope.progress"

_DETAILED_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d %(message)s"

#: run.json ``progress.recent_step_seconds`` keeps the durations of this many latest steps.
RECENT_STEPS = 20


def next_progress(progress: dict[str, Any], step: int, now: float) -> dict[str, Any]:
    """run.json ``progress`` once ``step`` is logged at ``now``: the next step starts then.

    A step's duration is the time since the previous step was logged in this process; a step that
    did not start then (the first one after a start or a restart holds the set-up) is not timed.
    """
    recent = list(progress.get("recent_step_seconds") or [])
    started = progress.get("step_started_at")
    if started is not None and started == progress.get("last_step_at"):
        recent = [*recent, round(now - float(progress["step_started_at"]), 3)][-RECENT_STEPS:]
    return {
        "step": step + 1,
        "step_started_at": now,
        "last_step": step,
        "last_step_at": now,
        "recent_step_seconds": recent,
    }


def restarted_progress(progress: dict[str, Any], restart: dict[str, Any], now: float) -> dict[str, Any]:
    """run.json ``progress`` once the run restarted from checkpoint step ``restart["from_step"]`` at
    ``now``: the step after the checkpoint is in progress since then (not timed: it holds the set-up)."""
    return {**progress, "step": int(restart["from_step"]) + 1, "step_started_at": now}


def model_info(cfg: TelescopeConfig) -> dict[str, str]:
    """``{"model": name}`` as the user wrote it (the driver hands loggers the resolved folder)."""
    from telescope.core.models.tiny import builtin_model_name

    return {"model": builtin_model_name(cfg.model)} if cfg.model else {}


def reward_ranges(cfg: TelescopeConfig) -> dict[str, dict[str, float | None]]:
    """``{env name: {"min", "max"}}`` from the config's reward_min/reward_max (None = observed)."""
    return {str(env.name): {"min": env.reward_min, "max": env.reward_max} for env in cfg.environments}


def block_layout(cfg: TelescopeConfig, previous: dict[str, Any]) -> dict[str, float]:
    """Block sizes of the run directory: those of the first start win, so a resume keeps numbering."""
    layout = {
        "rollout_block_size": cfg.rollout_block_size,
        "event_block_duration_seconds": float(cfg.event_block_duration_seconds),
    }
    return {**layout, **dict(previous.get("layout", {}))}


def eval_sample_record(step: int, name: str, row: dict[str, Any]) -> dict[str, Any]:
    """``{"step", "name", **row}``; a row's own ``step``/``name`` keys are kept as ``row_step``/``row_name``."""
    record: dict[str, Any] = {"step": step, "name": name}
    for key, value in row.items():
        record[f"row_{key}" if key in ("step", "name") else key] = value
    return record


class LocalLogger(Logger):
    """Writes config.yaml, run.json, metrics/system JSONL, rollout/event blocks, evals and logs/.

    Step metrics, rollouts and evals are appended at once (crash safety); events at every tick
    (``EventBlocks``); samples (system, vLLM, torch memory) are buffered and appended every
    ``metrics_logger_interval_seconds``; ``events/tail.jsonl.zst`` is rewritten every
    ``event_upload_interval_seconds``. ``clock`` (unix seconds) drives both and the blocks.
    """

    name = "local"
    required = True

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.run_dir: Path | None = None
        self._clock = clock
        self._writers: dict[str, JsonlWriter] = {}
        self._meta: dict[str, Any] = {}
        self._handlers: list[logging.Handler] = []
        self._previous_level = logging.NOTSET
        self._events: EventBlocks | None = None
        self._rollouts: StepBlocks | None = None
        self._samples: IntervalBuffer[dict[str, Any]] | None = None
        self._tail_gate: IntervalGate | None = None
        self._stdio: StdioCapture | None = None
        self._progress = StepProgress(0)

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / CONFIG_FILE, "w", encoding="utf-8") as f:
            yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
        previous = read_run_meta(self.run_dir) if (self.run_dir / RUN_FILE).exists() else {}
        run_id = (resume_ids or {}).get("run_id") or previous.get("run_id") or uuid.uuid4().hex[:12]
        now = self._clock()
        self._meta = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "name": cfg.wandb_run_name,
            "status": "running",
            "created_at": previous.get("created_at", now),
            "started_at": now,
            "finished_at": None,
            "starts": int(previous.get("starts", 0)) + 1,
            "layout": block_layout(cfg, previous),
            "info": {**previous.get("info", {}), "reward_ranges": reward_ranges(cfg), **model_info(cfg)},
            # run health is recorded, not inferred from file writes: the step in progress and
            # since when (the dashboard and `runs show` read it); durations survive a resume
            "progress": {
                "step": None,
                "step_started_at": now,
                "last_step": None,
                "last_step_at": None,
                "recent_step_seconds": (previous.get("progress") or {}).get("recent_step_seconds", []),
            },
        }
        write_json_atomic(self.run_dir / RUN_FILE, self._meta)
        self._open_writers(cfg)
        self._attach_log_files(self.run_dir / LOGS_DIR)
        self._progress = StepProgress(cfg.number_of_steps)

    def _open_writers(self, cfg: TelescopeConfig) -> None:
        assert self.run_dir is not None
        for fname in (METRICS_FILE, SYSTEM_FILE, EVAL_METRICS_FILE, EVAL_SAMPLES_FILE):
            self._writers[fname] = JsonlWriter(self.run_dir / fname)
        layout = self._meta["layout"]
        self._rollouts = StepBlocks(self.run_dir / ROLLOUTS_DIR, int(layout["rollout_block_size"]))
        self._events = EventBlocks(
            self.run_dir / EVENTS_DIR,
            origin=float(self._meta["created_at"]),
            block_duration_s=float(layout["event_block_duration_seconds"]),
            tail_window_s=float(cfg.event_tail_window_seconds),
            clock=self._clock,
        )
        self._events.write_tail()  # the tail exists from the start (empty until events come)
        self._tail_gate = IntervalGate(float(cfg.event_upload_interval_seconds), self._clock)
        self._samples = IntervalBuffer(
            self._writers[SYSTEM_FILE].write_many,
            cfg.metrics_logger_interval_seconds,
            clock=self._clock,
        )

    def _attach_log_files(self, logs_dir: Path) -> None:
        """telescope.log (INFO), telescope.detailed.log (DEBUG, file:line) and telescope.stdout.log.

        The first two take the 'telescope.*' Python loggers; the third is a copy of everything
        the process prints (``StdioCapture``).
        """
        logs_dir.mkdir(parents=True, exist_ok=True)
        self._stdio = StdioCapture(logs_dir / STDOUT_LOG_NAME)
        self._stdio.start()
        root = logging.getLogger("telescope")
        for fname, level, fmt in (
            ("telescope.log", logging.INFO, "%(asctime)s %(levelname)s %(name)s %(message)s"),
            ("telescope.detailed.log", logging.DEBUG, _DETAILED_FORMAT),
        ):
            handler = logging.FileHandler(logs_dir / fname, encoding="utf-8")
            handler.setLevel(level)
            handler.setFormatter(logging.Formatter(fmt))
            if level > logging.DEBUG:  # the detailed log keeps every repeat
                handler.addFilter(shared_repeat_filter())
            root.addHandler(handler)
            self._handlers.append(handler)
        self._previous_level = root.level
        if root.level == logging.NOTSET or root.level > logging.DEBUG:
            root.setLevel(logging.DEBUG)  # so the detailed file sees DEBUG; restored in finish()

    def _writer(self, fname: str) -> JsonlWriter:
        if fname not in self._writers:
            raise RuntimeError(f"local logger: {fname} written before start(): call LoggerHub.start first")
        return self._writers[fname]

    def _log_line(self, message: str) -> None:
        """One INFO line into telescope.log and the detailed log only (not the console: it shows its own)."""
        record = logging.LogRecord(PROGRESS_LOGGER, logging.INFO, __file__, 0, message, None, None)
        for handler in self._handlers:
            handler.handle(record)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        now = time.time()
        self._writer(METRICS_FILE).write({"step": step, "time": now, "metrics": metrics})
        self._log_line(self._progress.update(step, metrics).text())  # progress reaches the run directory
        self._meta["progress"] = next_progress(self._meta.get("progress") or {}, step, self._clock())
        self._write_meta()

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        self._started(self._rollouts).write(step, [r.to_dict() for r in rows])

    def log_events(self, events: list[TimelineEvent]) -> None:
        self._started(self._events).write(events)  # dataclasses: encode_line writes their fields
        progress = self._meta.get("progress")
        if progress is not None and progress.get("step") is None:  # the first step after a start
            first = next((e.step for e in events if e.type == "trainer" and e.phase == "start"), None)
            if first is not None:
                progress["step"] = first
                self._write_meta()

    def log_system(self, sample: dict[str, Any]) -> None:
        self._started(self._samples).add(sample)

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self._writer(EVAL_METRICS_FILE).write(
            {"step": step, "name": name, "time": self._clock(), "metrics": metrics, "samples": len(rows)}
        )
        self._writer(EVAL_SAMPLES_FILE).write_many([eval_sample_record(step, name, r) for r in rows])

    def _started(self, part: Any) -> Any:
        if part is None:
            raise RuntimeError("local logger: written before start(): call LoggerHub.start first")
        return part

    def tick(self) -> None:
        if self._events is not None:
            self._events.flush()
        if self._samples is not None:
            self._samples.tick()
        if self._tail_gate is not None and self._events is not None and self._tail_gate.due():
            self._events.write_tail()

    def log_info(self, info: dict[str, Any]) -> None:
        setup = info.get("setup")
        if isinstance(setup, dict) and "summary" in setup:  # the runtime's, as computed once
            self._log_line(f"start: {setup['summary']}")
            for note in setup.get("notes") or []:
                self._log_line(f"note: {note}")
        self._meta.setdefault("info", {}).update(info)
        restarts = info.get("restarts")
        if isinstance(restarts, list) and restarts and self._meta.get("progress") is not None:
            self._meta["progress"] = restarted_progress(self._meta["progress"], restarts[-1], self._clock())
        if self.run_dir is not None:
            self._write_meta()

    def _write_meta(self) -> None:
        assert self.run_dir is not None
        path = self.run_dir / RUN_FILE
        try:
            write_json_atomic(path, self._meta)
        except OSError as exc:
            raise StorageError(f"{path} could not be written: {describe_os_error(exc)}") from exc

    def finish(self, status: str) -> None:
        """Close everything, each part on its own (one failing part, e.g. a full disk, must not
        keep the others open), then write the final status into run.json; the first error is raised."""
        errors: list[BaseException] = []
        for close in (self._flush_buffers, self._close_writers, self._detach_log_files):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - finish the other parts, report the first
                errors.append(exc)
        if self.run_dir is not None:
            self._meta.update(status=status, finished_at=time.time())
            try:
                self._write_meta()
            except StorageError as exc:
                errors.append(exc)
                self._write_meta_in_place()
        if errors:
            raise errors[0]

    def _flush_buffers(self) -> None:
        if self._samples is not None:
            self._samples.flush()
        if self._events is not None:
            self._events.flush()
            self._events.write_tail()

    def _close_writers(self) -> None:
        if self._events is not None:
            self._events.close()
        if self._rollouts is not None:
            self._rollouts.close()
        for writer in self._writers.values():
            writer.close()

    def _detach_log_files(self) -> None:
        root = logging.getLogger("telescope")
        for handler in self._handlers:
            root.removeHandler(handler)
            handler.close()
        self._handlers.clear()
        root.setLevel(self._previous_level)
        if self._stdio is not None:
            self._stdio.stop()
            self._stdio = None

    def _write_meta_in_place(self) -> None:
        """Last resort on a full disk: overwrite run.json in place (its own blocks are reused), so
        the final status is recorded even when the atomic copy finds no space."""
        assert self.run_dir is not None
        with contextlib.suppress(OSError), open(self.run_dir / RUN_FILE, "r+", encoding="utf-8") as f:
            text = json.dumps(self._meta, indent=2, default=str)
            f.write(text)
            f.truncate()

    def run_ids(self) -> dict[str, Any]:
        return {"run_id": self._meta["run_id"]} if self._meta else {}
