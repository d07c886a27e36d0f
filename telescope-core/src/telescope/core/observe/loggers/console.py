"""``console`` logger: a live status line under the step history on a terminal, plain lines elsewhere.

Plain mode (not a terminal: CI, ``nohup``, a scheduler's log): one line per step, never
wrapped, no ANSI codes, no carriage returns; what else the process prints (Ray's copies of
the workers' output included) is cleaned the same way (``PlainStdio``).

Live mode (a terminal): every finished step is printed as a line (the history stays in the
scrollback) and a status line with a bar stays below it, redrawn with a counting-down ETA.
Both fit the terminal's width by dropping the least important fields; the step counter and
the ETA always stay.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from telescope.core.observe.base import Logger
from telescope.core.observe.logfilter import shared_repeat_filter
from telescope.core.observe.loggers.progress import (
    Field,
    StepLine,
    StepProgress,
    fit_fields,
    format_duration,
    format_progress,
    progress_fields,
)
from telescope.core.observe.stdio import PlainStdio

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["ConsoleLogger", "LiveStatus", "format_duration", "format_eval", "format_progress"]


def format_eval(step: int, name: str, metrics: dict[str, float], samples: int, limit: int = 8) -> str:
    """``eval math @ step 10: pass@1 0.4500, accuracy 0.4400 (500 samples)`` (first ``limit`` metrics, sorted)."""
    shown = []
    for key in sorted(metrics)[:limit]:
        value = metrics[key]
        shown.append(f"{key} {value:.4f}" if isinstance(value, int | float) else f"{key} {value}")
    more = f", +{len(metrics) - limit} more" if len(metrics) > limit else ""
    body = ", ".join(shown) if shown else "no metrics"
    return f"eval {name} @ step {step}: {body}{more} ({samples} samples)"


class LiveStatus:
    """The status line under the step history: ``━━━━━━────── step 3/10 | ETA 1m05s | reward ...``.

    Rendered at the console's width on every refresh: the ETA counts down from the last
    step's estimate; the bar is dropped below 50 columns, fields by rank (``fit_fields``).
    """

    def __init__(self, total: int, clock: Callable[[], float]) -> None:
        self.total = total
        self.last: StepLine | None = None
        self._clock = clock
        self._t0 = clock()

    def text(self, width: int) -> Text:
        now = self._clock()
        bar_width = min(30, width // 4) if width >= 50 else 0
        room = width - bar_width - 1 if bar_width else width
        if self.last is None:
            done = 0
            waiting = Field(f"starting {format_duration(now - self._t0)}", 1)
            fields = [*progress_fields(0, self.total, {}, 0, 0, None)[:2], waiting]
        else:
            done = self.last.done
            eta = None if self.last.eta_s is None else max(self.last.eta_s - (now - self.last.at), 0.0)
            counting = Field(f"ETA {format_duration(eta)}", 0)
            fields = [counting if f.text.startswith("ETA ") else f for f in self.last.fields]
        line = Text()
        if bar_width:
            filled = round(bar_width * done / self.total) if self.total else 0
            line.append("━" * filled, style="magenta")
            line.append("─" * (bar_width - filled), style="grey35")  # thinner: readable without colours
            line.append(" ")
        line.append(fit_fields(fields, room), style="bold")
        return line

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text(options.max_width)


class ConsoleLogger(Logger):
    """Progress and warnings for people. ``plain=None`` picks live mode only on a TTY."""

    name = "console"

    def __init__(
        self,
        console: Console | None = None,
        plain: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        # Bound to the stderr of now, before the local logger tees sys.stderr into
        # logs/telescope.stdout.log: live redraws would flood that file, and the step lines
        # and warnings shown here go to telescope.log already.
        self.console = console or Console(file=sys.stderr, highlight=False)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.progress = StepProgress(0, clock)
        self._t0 = self._clock()
        self._status: LiveStatus | None = None
        self._live: Any = None
        self._stdio: PlainStdio | None = None
        self._handler: logging.Handler | None = None

    @property
    def total(self) -> int:
        return self.progress.total

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        self.progress = StepProgress(cfg.number_of_steps, self._clock)
        self._t0 = self._clock()
        self._print(f"telescope run '{getattr(cfg, 'wandb_run_name', '')}' -> {run_dir}")
        self._attach_warning_handler()
        if not self.plain:
            from rich.live import Live

            self._status = LiveStatus(self.total, self._clock)
            # redirect: what the process prints (Ray's worker lines) goes above the status line
            self._live = Live(
                self._status,
                console=self.console,
                refresh_per_second=2,
                transient=True,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self._live.start()
        # cleaned in both modes: on a terminal, rich alone would keep only the text after the last
        # '\r' of a worker's progress bar, dropping Ray's "(TrainerWorker pid=..)" in front of it
        self._stdio = PlainStdio()
        self._stdio.start()

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
        if self.plain:  # no rich: no wrapping at 80 columns, no escape codes
            stream = self.console.file
            stream.write(text.replace("\r", "") + "\n")
            stream.flush()
            return
        self.console.print(text, style=style, markup=False, highlight=False)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        line = self.progress.update(step, metrics)
        if self.plain:
            self._print(line.text())
            return
        self._print(line.text(self.console.width))  # history: fitted, so one row per step
        if self._status is not None:
            self._status.last = line
            if self._live is not None:
                self._live.refresh()

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self._print(format_eval(step, name, metrics, len(rows)), style="bold cyan")

    def warn(self, message: str) -> None:
        self._print(f"WARNING: {message}", style="bold yellow")

    def finish(self, status: str) -> None:
        if self._handler is not None:
            logging.getLogger("telescope").removeHandler(self._handler)
            self._handler = None
        if self._stdio is not None:  # first: rich restores the streams only if its proxies are on top
            self._stdio.stop()
            self._stdio = None
        if self._live is not None:
            self._live.stop()
            self._live = None
        elapsed = format_duration(self._clock() - self._t0)
        self._print(
            f"run {status} after {elapsed}", style="bold green" if status == "finished" else "bold red"
        )
