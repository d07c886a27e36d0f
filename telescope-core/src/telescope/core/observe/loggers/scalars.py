"""Base of the loggers whose records are scalars by step (TensorBoard, MLflow), and their import guard."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from telescope.core.observe.base import Logger
from telescope.core.observe.loggers.spans import SpanTimes
from telescope.core.observe.loggers.tables import eval_scalars, finite_scalars
from telescope.core.observe.rundir.records import TimelineEvent

__all__ = ["ScalarLogger", "import_for"]


def import_for(field: str, module: str, install: str) -> ModuleType:
    """``import module`` for the logger that config bool ``field`` turns on, or an ImportError naming the fix."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{field} is true but {module} cannot be imported ({exc}): pip install {install}, or set {field}: false"
        ) from None


class ScalarLogger(Logger):
    """Step metrics, eval scores and the timeline's per-step span durations, all through ``write_scalars``.

    Only finite numbers are written (text, bools, NaN and inf are dropped). Timeline events
    are paired into spans (``observe.spans``); a step's span durations
    (``timeline/<span>/{mean_s,max_s,count}``) are written with the first ``log_step`` at
    or after it, and the rest by ``flush_spans(None)``, which ``finish`` must call.
    """

    def __init__(self) -> None:
        self.spans = SpanTimes()

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement write_scalars")

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.write_scalars(finite_scalars(metrics), step)
        self.flush_spans(step)

    def flush_spans(self, upto_step: int | None) -> None:
        """Write the span durations of the steps up to ``upto_step`` (all when None)."""
        for stats in self.spans.take(upto_step):
            assert stats.step is not None
            self.write_scalars(stats.scalars(), stats.step)

    def log_events(self, events: list[TimelineEvent]) -> None:
        self.spans.add(events)

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self.write_scalars(finite_scalars(eval_scalars(name, metrics)), step)
