"""``tensorboard`` logger (``use_tensorboard``): event files under ``tensorboard_dir`` (default ``RUN_DIR/tensorboard``).

Scalars: every finite step metric under its own name, eval scores as ``eval/<name>/<metric>``,
and the timeline as ``timeline/<span>/{mean_s,max_s,count}`` per step (``SpanTimes``: a span
counts for the step it started in, and is written with the first ``log_step`` at or after
that step). Text: the config (``config``), each step's rollouts (``rollouts``, a Markdown
table), each eval's samples (``eval/<name>/samples``), run info (``info``) and, at finish,
the run's span totals (``timeline/summary``) and status (``run/status``).

torch's ``SummaryWriter`` buffers and flushes from its own thread every
``metrics_logger_interval_seconds``, so no call here waits on the disk. On resume the writer opens at the first step logged with
``purge_step`` set to it: TensorBoard then hides what the crashed run wrote past the
checkpoint, and the resumed steps replace it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.observe.loggers.scalars import ScalarLogger, import_for
from telescope.core.observe.loggers.tables import (
    ROLLOUT_TABLE_COLUMNS,
    eval_table,
    markdown_table,
    rollout_table_row,
)
from telescope.core.observe.rundir.layout import config_to_dict
from telescope.core.observe.rundir.records import RolloutRecord

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["TENSORBOARD_DIR", "TensorBoardLogger"]

#: Default log directory, inside the run directory.
TENSORBOARD_DIR = "tensorboard"


def _code_block(data: Any) -> str:
    """JSON in a Markdown code block (TensorBoard renders text as Markdown)."""
    return "```json\n" + json.dumps(data, indent=2, sort_keys=True, default=str) + "\n```"


class TensorBoardLogger(ScalarLogger):
    """One event-file directory per Telescope run (a resumed run appends a new file to it).

    Args:
        with_rollouts: write each step's rollouts and each eval's samples as text.
        max_rows: rows per rollout/sample table (the run directory keeps them all).
        flush_secs: how often the writer's thread flushes to disk (None: ``metrics_logger_interval_seconds``).
    """

    name = "tensorboard"

    def __init__(
        self, *, with_rollouts: bool = True, max_rows: int = 64, flush_secs: float | None = None
    ) -> None:
        self.with_rollouts = with_rollouts
        self.max_rows = max_rows
        self.flush_secs = flush_secs
        super().__init__()
        self.log_dir: Path | None = None
        self._writer: Any = None
        self._writer_cls: Any = None
        self._resuming = False
        self._last_step = 0
        self._deferred: list[tuple[str, str]] = []  # text logged on resume before the first step
        self._lock = threading.RLock()

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        self._writer_cls = import_for(
            "use_tensorboard", "torch.utils.tensorboard", "tensorboard"
        ).SummaryWriter
        self.log_dir = Path(cfg.tensorboard_dir or Path(run_dir) / TENSORBOARD_DIR)
        if self.flush_secs is None:
            self.flush_secs = cfg.metrics_logger_interval_seconds
        self._resuming = bool(resume_ids)
        self._text("config", _code_block(config_to_dict(cfg)))  # at step 0, or the resumed run's first

    def _open(self, step: int) -> Any:
        """The writer, opened now if needed (on resume with ``purge_step=step``)."""
        with self._lock:
            if self._writer is None:
                if self._writer_cls is None:
                    raise RuntimeError(
                        "tensorboard logger: logged before start(): call LoggerHub.start first"
                    )
                purge = step if self._resuming else None
                self._writer = self._writer_cls(
                    str(self.log_dir), flush_secs=self.flush_secs, purge_step=purge
                )
                for tag, text in self._deferred:
                    self._writer.add_text(tag, text, step)
                self._deferred.clear()
            self._last_step = max(self._last_step, step)
            return self._writer

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        writer = self._open(step)
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)

    def _text(self, tag: str, text: str, step: int | None = None) -> None:
        with self._lock:
            if step is None:
                if self._writer is None and self._resuming:
                    self._deferred.append((tag, text))  # the purge step is not known yet
                    return
                step = self._last_step
            self._open(step).add_text(tag, text, step)

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        if not rows or not self.with_rollouts:
            return
        data = [rollout_table_row(r) for r in rows[: self.max_rows]]
        text = markdown_table(ROLLOUT_TABLE_COLUMNS, data)
        if len(rows) > self.max_rows:
            text += f"\n\n{len(rows) - self.max_rows} more rows in the run directory (rollouts/)."
        self._text("rollouts", text, step)

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        super().log_eval(step, name, metrics, rows)
        if rows and self.with_rollouts:
            columns, data = eval_table(rows[: self.max_rows])
            self._text(f"eval/{name}/samples", markdown_table(columns, data), step)

    def log_info(self, info: dict[str, Any]) -> None:
        self._text("info", _code_block(info))

    def finish(self, status: str) -> None:
        if self._writer_cls is None:
            return
        with self._lock:
            self._resuming = False  # a resumed run that logged no step purges nothing
            self._open(self._last_step)
        self.flush_spans(None)
        if self.spans.totals():
            self._text("timeline/summary", self.spans.summary_markdown())
        self._text("run/status", status)
        with self._lock:
            self._writer.close()
            self._writer = None
            self._writer_cls = None

    def run_ids(self) -> dict[str, Any]:
        return {"log_dir": str(self.log_dir)} if self.log_dir is not None else {}
