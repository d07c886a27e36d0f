"""``wandb`` logger (``use_wandb``): step metrics as scalars, rollouts as tables, code and logs.

Honours every seed ``wandb_*`` field. ``WANDB_MODE=offline`` works without network; the W&B
files then live under ``RUN_DIR/wandb/``. History writes (step scalars, rollout tables, eval
scores) are queued and sent, in order, every ``metrics_logger_interval_seconds`` from the
hub's tick thread, so a slow W&B never blocks training. Every ``event_upload_interval_seconds``
the local ``events/tail.jsonl.zst`` and every closed event/rollout block are uploaded
(``BlockUploader``); the open blocks go at finish. System samples stay local (W&B samples
its own system stats).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.observe.base import Logger
from telescope.core.observe.loggers.code_files import select_code_files
from telescope.core.observe.loggers.scalars import import_for
from telescope.core.observe.loggers.tables import (
    ROLLOUT_TABLE_COLUMNS,
    eval_scalars,
    eval_table,
    rollout_table_row,
)
from telescope.core.observe.loggers.wandb_uploads import BlockUploader
from telescope.core.observe.periodic import IntervalBuffer
from telescope.core.observe.rundir.layout import LOGS_DIR, config_to_dict
from telescope.core.observe.rundir.records import SCHEMA_VERSION, RolloutRecord

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["ROLLOUT_TABLE_COLUMNS", "WandbLogger", "log_files_to_upload"]


def log_files_to_upload(run_dir: Path, *, logs: bool, detailed: bool, stdout: bool) -> list[Path]:
    """Files under ``RUN_DIR/logs`` selected by the upload switches.

    ``*.detailed.log`` needs ``detailed``, ``*.stdout.log`` needs ``stdout``, other ``*.log``
    files need ``logs``; with ``logs`` off nothing is uploaded.
    """
    if not logs:
        return []
    out = []
    for path in sorted((run_dir / LOGS_DIR).rglob("*.log")):
        if path.name.endswith(".detailed.log"):
            ok = detailed
        elif path.name.endswith(".stdout.log"):
            ok = stdout
        else:
            ok = True
        if ok:
            out.append(path)
    return out


class WandbLogger(Logger):
    """One W&B run per Telescope run; resumes the same id when ``resume_ids`` has it.

    Args:
        code_root: folder uploaded as code (default: the working directory).
        upload_rollouts: log each step's rollouts and each eval's samples as tables.
        clock: monotonic seconds for the history and upload intervals (tests inject one).
    """

    name = "wandb"

    def __init__(
        self,
        code_root: str | None = None,
        *,
        upload_rollouts: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.code_root = Path(code_root or os.getcwd())
        self.upload_rollouts = upload_rollouts
        self.run: Any = None
        self._cfg: TelescopeConfig | None = None
        self._run_dir: Path | None = None
        self._ids: dict[str, Any] = {}
        self._clock = clock
        self._history: IntervalBuffer[tuple[dict[str, Any], int]] | None = None
        self._uploader: BlockUploader | None = None
        self._run_lock = threading.RLock()  # one W&B call at a time (caller and tick threads)

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        wandb = import_for("use_wandb", "wandb", "wandb")
        self._cfg, self._run_dir = cfg, Path(run_dir)
        resume_id = (resume_ids or {}).get("id")
        tags = list(cfg.wandb_tags) + [f"schema_version:{SCHEMA_VERSION}"]
        self.run = wandb.init(
            project=cfg.wandb_project,
            name=cfg.wandb_run_name,
            tags=tags,
            config=config_to_dict(cfg),
            dir=str(self._run_dir),
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        self._ids = {"id": self.run.id, "project": self.run.project}
        self._history = IntervalBuffer(
            self._send_history, float(cfg.metrics_logger_interval_seconds), clock=self._clock, max_items=1000
        )
        self._uploader = BlockUploader(
            self._save, self._run_dir, float(cfg.event_upload_interval_seconds), clock=self._clock
        )
        if cfg.wandb_upload_code:
            self._upload_code()

    def _send_history(self, entries: list[tuple[dict[str, Any], int]]) -> None:
        with self._run_lock:
            for payload, step in entries:
                self.run.log(payload, step=step)

    def _save(self, path: Path) -> None:
        assert self._run_dir is not None
        with self._run_lock:
            self.run.save(str(path), base_path=str(self._run_dir), policy="now")

    def _queue(self, payload: dict[str, Any], step: int) -> None:
        if self._history is None:
            raise RuntimeError("wandb logger: logged before start(): call LoggerHub.start first")
        self._history.add((payload, step))

    def _upload_code(self) -> None:
        cfg = self._cfg
        assert cfg is not None  # called from start()
        files = set(
            select_code_files(
                self.code_root, cfg.wandb_code_max_file_size_mb, list(cfg.wandb_code_exclude_patterns)
            )
        )
        root = str(self.code_root)
        self.run.log_code(
            root=root,
            include_fn=lambda path, root=root: os.path.relpath(path, root) in files,
            exclude_fn=lambda path, root=root: os.path.relpath(path, root) not in files,
        )

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._queue(dict(metrics), step)

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        if not rows or not self.upload_rollouts:
            return
        import wandb

        table = wandb.Table(
            columns=list[Any](ROLLOUT_TABLE_COLUMNS), data=[rollout_table_row(r) for r in rows]
        )
        self._queue({"rollouts": table}, step)

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        payload: dict[str, Any] = dict(eval_scalars(name, metrics))
        if rows and self.upload_rollouts:
            import wandb

            columns, data = eval_table(rows)
            payload[f"eval/{name}/samples"] = wandb.Table(columns=list[Any](columns), data=data)
        if payload:
            self._queue(payload, step)

    def log_info(self, info: dict[str, Any]) -> None:
        with self._run_lock:
            for key, value in info.items():
                self.run.summary[key] = value

    def tick(self) -> None:
        if self._history is not None:
            self._history.tick()
        if self._uploader is not None:
            self._uploader.tick()

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        cfg, run_dir = self._cfg, self._run_dir
        assert cfg is not None and run_dir is not None  # self.run is set: start() ran
        if self._history is not None:
            self._history.flush()
        if self._uploader is not None:
            self._uploader.upload_all()
        for path in log_files_to_upload(
            run_dir,
            logs=cfg.wandb_upload_logs,
            detailed=cfg.wandb_upload_logs_detailed,
            stdout=cfg.wandb_upload_logs_stdout,
        ):
            self.run.save(str(path), base_path=str(run_dir), policy="now")
        self.run.finish(exit_code=0 if status == "finished" else 1)
        self.run = None

    def run_ids(self) -> dict[str, Any]:
        return dict(self._ids)
