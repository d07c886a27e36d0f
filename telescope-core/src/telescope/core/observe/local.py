"""``local`` logger: the run directory, always on (layout in ``docs/run-directory.md``)."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from telescope.core.observe.base import Logger
from telescope.core.observe.jsonl import JsonlWriter
from telescope.core.observe.layout import (
    CONFIG_FILE,
    EVENTS_FILE,
    LOGS_DIR,
    METRICS_FILE,
    ROLLOUTS_FILE,
    RUN_FILE,
    SYSTEM_FILE,
    config_to_dict,
    write_json_atomic,
)
from telescope.core.observe.reader import read_run_meta
from telescope.core.observe.records import SCHEMA_VERSION, RolloutRecord, TimelineEvent

__all__ = ["LocalLogger"]

_DETAILED_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d %(message)s"


def reward_ranges(cfg: Any) -> dict[str, dict[str, float | None]]:
    """``{env name: {"min", "max"}}`` from the config's reward_min/reward_max (None = observed)."""
    return {
        str(env.name): {"min": getattr(env, "reward_min", None), "max": getattr(env, "reward_max", None)}
        for env in getattr(cfg, "environments", []) or []
    }


class LocalLogger(Logger):
    """Writes config.yaml, run.json, metrics/rollouts/events/system JSONL and logs/."""

    name = "local"
    required = True

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self._writers: dict[str, JsonlWriter] = {}
        self._meta: dict[str, Any] = {}
        self._handlers: list[logging.Handler] = []
        self._previous_level = logging.NOTSET

    def start(self, cfg: Any, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / CONFIG_FILE, "w", encoding="utf-8") as f:
            yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
        previous = read_run_meta(self.run_dir) if (self.run_dir / RUN_FILE).exists() else {}
        run_id = (resume_ids or {}).get("run_id") or previous.get("run_id") or uuid.uuid4().hex[:12]
        self._meta = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "name": getattr(cfg, "wandb_run_name", ""),
            "status": "running",
            "created_at": previous.get("created_at", time.time()),
            "started_at": time.time(),
            "finished_at": None,
            "starts": int(previous.get("starts", 0)) + 1,
            "info": {**previous.get("info", {}), "reward_ranges": reward_ranges(cfg)},
        }
        write_json_atomic(self.run_dir / RUN_FILE, self._meta)
        for fname in (METRICS_FILE, ROLLOUTS_FILE, EVENTS_FILE, SYSTEM_FILE):
            self._writers[fname] = JsonlWriter(self.run_dir / fname)
        self._attach_log_files(self.run_dir / LOGS_DIR)

    def _attach_log_files(self, logs_dir: Path) -> None:
        """telescope.log (INFO) and telescope.detailed.log (DEBUG, file:line) for 'telescope.*' loggers."""
        logs_dir.mkdir(parents=True, exist_ok=True)
        root = logging.getLogger("telescope")
        for fname, level, fmt in (
            ("telescope.log", logging.INFO, "%(asctime)s %(levelname)s %(name)s %(message)s"),
            ("telescope.detailed.log", logging.DEBUG, _DETAILED_FORMAT),
        ):
            handler = logging.FileHandler(logs_dir / fname, encoding="utf-8")
            handler.setLevel(level)
            handler.setFormatter(logging.Formatter(fmt))
            root.addHandler(handler)
            self._handlers.append(handler)
        self._previous_level = root.level
        if root.level == logging.NOTSET or root.level > logging.DEBUG:
            root.setLevel(logging.DEBUG)  # so the detailed file sees DEBUG; restored in finish()

    def _writer(self, fname: str) -> JsonlWriter:
        if fname not in self._writers:
            raise RuntimeError(f"local logger: {fname} written before start(): call LoggerHub.start first")
        return self._writers[fname]

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._writer(METRICS_FILE).write({"step": step, "time": time.time(), "metrics": metrics})

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        self._writer(ROLLOUTS_FILE).write_many([r.to_dict() for r in rows])

    def log_events(self, events: list[TimelineEvent]) -> None:
        self._writer(EVENTS_FILE).write_many([e.to_dict() for e in events])

    def log_system(self, sample: dict[str, Any]) -> None:
        self._writer(SYSTEM_FILE).write(sample)

    def log_info(self, info: dict[str, Any]) -> None:
        self._meta.setdefault("info", {}).update(info)
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / RUN_FILE, self._meta)

    def finish(self, status: str) -> None:
        for writer in self._writers.values():
            writer.close()
        root = logging.getLogger("telescope")
        for handler in self._handlers:
            root.removeHandler(handler)
            handler.close()
        self._handlers.clear()
        root.setLevel(self._previous_level)
        if self.run_dir is not None:
            self._meta.update(status=status, finished_at=time.time())
            write_json_atomic(self.run_dir / RUN_FILE, self._meta)

    def run_ids(self) -> dict[str, Any]:
        return {"run_id": self._meta["run_id"]} if self._meta else {}
