"""``console`` logger: live progress with rich on a terminal, plain lines elsewhere (CI logs)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from telescope.core.observe.base import Logger
from telescope.core.observe.logfilter import shared_repeat_filter

__all__ = ["ConsoleLogger", "format_duration", "format_eval", "format_progress"]

#: Step-metric keys the progress line reads (first one present wins).
REWARD_KEYS = ("reward/mean",)
STEP_TIME_KEYS = ("perf/step_time_s", "timing_step_total")
TOKENS_PER_S_KEYS = ("perf/tokens_per_s",)
ASYNC_KEYS = ("perf/async_level",)


def _first(metrics: dict[str, float], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s`` or ``42s``; ``?`` when unknown."""
    if seconds is None or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_progress(
    step: int, total: int, metrics: dict[str, float], discarded: int, cancelled: int, eta_s: float | None
) -> str:
    """The one-line step summary (shared by the live display and plain mode)."""
    parts = [f"step {step}/{total}", f"ETA {format_duration(eta_s)}"]
    reward = _first(metrics, REWARD_KEYS)
    parts.append(f"reward {reward:.4f}" if reward is not None else "reward -")
    step_time = _first(metrics, STEP_TIME_KEYS)
    parts.append(f"step {step_time:.2f}s" if step_time is not None else "step -")
    tps = _first(metrics, TOKENS_PER_S_KEYS)
    parts.append(f"{tps:,.0f} tok/s" if tps is not None else "- tok/s")
    async_level = _first(metrics, ASYNC_KEYS)
    parts.append(f"async {async_level:.0f}" if async_level is not None else "async -")
    parts.append(f"discarded {discarded}")
    parts.append(f"cancelled {cancelled}")
    return " | ".join(parts)


def format_eval(step: int, name: str, metrics: dict[str, float], samples: int, limit: int = 8) -> str:
    """``eval math @ step 10: pass@1 0.4500, accuracy 0.4400 (500 samples)`` (first ``limit`` metrics, sorted)."""
    shown = []
    for key in sorted(metrics)[:limit]:
        value = metrics[key]
        shown.append(f"{key} {value:.4f}" if isinstance(value, int | float) else f"{key} {value}")
    more = f", +{len(metrics) - limit} more" if len(metrics) > limit else ""
    body = ", ".join(shown) if shown else "no metrics"
    return f"eval {name} @ step {step}: {body}{more} ({samples} samples)"


class ConsoleLogger(Logger):
    """Progress and warnings for people. ``plain=None`` picks rich live mode only on a TTY.

    ETA = mean wall time per step logged in this process x steps left. Steps are taken as
    1-based unless a step 0 is logged (then ``step + 1`` steps are done).
    """

    name = "console"

    def __init__(
        self,
        console: Console | None = None,
        plain: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        # Bound to the stderr of now, before the local logger tees sys.stderr into
        # logs/telescope.stdout.log: live redraws would flood that file, and every fact shown
        # here is in metrics.jsonl and telescope.log already.
        self.console = console or Console(file=sys.stderr, highlight=False)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.total = 0
        self.discarded = 0
        self.cancelled = 0
        self._zero_based = False
        self._t0 = self._clock()
        self._first_done: int | None = None
        self._progress: Any = None
        self._task: Any = None
        self._handler: logging.Handler | None = None

    def start(self, cfg: Any, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        self.total = int(getattr(cfg, "number_of_steps", 0))
        self._t0 = self._clock()
        self._print(f"telescope run '{getattr(cfg, 'wandb_run_name', '')}' -> {run_dir}")
        self._attach_warning_handler()
        if not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                console=self.console, transient=False,
            )  # fmt: skip
            self._task = self._progress.add_task("", total=self.total or None)
            self._progress.start()

    def _attach_warning_handler(self) -> None:
        """Show WARNING+ records of 'telescope.*' Python loggers (not those the hub already sent)."""
        console_logger = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if getattr(record, "telescope_hub_warning", False):
                    return
                with contextlib.suppress(Exception):
                    console_logger._print(
                        f"{record.levelname}: [{record.name}] {record.getMessage()}", "bold yellow"
                    )

        self._handler = _Handler(level=logging.WARNING)
        self._handler.addFilter(shared_repeat_filter())  # identical warnings: once a minute, with a count
        logging.getLogger("telescope").addHandler(self._handler)

    def _print(self, text: str, style: str | None = None) -> None:
        target = self._progress.console if self._progress is not None else self.console
        target.print(text, style=None if self.plain else style, markup=False, highlight=False)

    def eta_seconds(self, done: int) -> float | None:
        """Seconds left from the mean time of the steps logged so far."""
        if self._first_done is None or done <= self._first_done - 1 or not self.total:
            return None
        steps_here = done - self._first_done + 1
        per_step = (self._clock() - self._t0) / steps_here
        return per_step * max(self.total - done, 0)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._zero_based = self._zero_based or step == 0
        done = step + 1 if self._zero_based else step
        if self._first_done is None:
            self._first_done = done
        self.discarded += int(metrics.get("discarded/count", 0) or 0)
        self.cancelled += int(metrics.get("cancelled/count", 0) or 0)
        line = format_progress(
            done, self.total, metrics, self.discarded, self.cancelled, self.eta_seconds(done)
        )
        if self._progress is not None:
            self._progress.update(self._task, completed=done, description=line.split(" | ", 1)[1])
        else:
            self._print(line)

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self._print(format_eval(step, name, metrics, len(rows)), style="bold cyan")

    def warn(self, message: str) -> None:
        self._print(f"WARNING: {message}", style="bold yellow")

    def finish(self, status: str) -> None:
        if self._handler is not None:
            logging.getLogger("telescope").removeHandler(self._handler)
            self._handler = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elapsed = format_duration(self._clock() - self._t0)
        self._print(
            f"run {status} after {elapsed}", style="bold green" if status == "finished" else "bold red"
        )
