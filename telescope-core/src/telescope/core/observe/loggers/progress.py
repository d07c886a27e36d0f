"""The step line people read: its fields, fitting it to a width, and the ETA behind it.

Shared by the console (plain lines, the live status line) and the run directory's
``logs/telescope.log``; each keeps its own ``StepProgress``, fed the same ``log_step`` calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from telescope.core.infra import summary

__all__ = [
    "Field",
    "StepLine",
    "StepProgress",
    "fit_fields",
    "format_duration",
    "format_progress",
    "format_seconds",
    "progress_fields",
]

#: Step-metric keys the step line reads (first one present wins).
REWARD_KEYS = ("reward/mean",)
STEP_TIME_KEYS = ("perf/step_time_s", "timing_step_total")
TOKENS_PER_S_KEYS = ("perf/tokens_per_s",)
ASYNC_KEYS = ("perf/async_level",)

SEPARATOR = " | "


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


def format_seconds(seconds: float | None) -> str:
    """``format_duration`` with tenths below 10 s (``0.6s``, ``3s``): a step of the quickstart takes
    under a second."""
    if seconds is None or seconds < 0 or seconds >= 10:
        return format_duration(seconds)
    return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"


@dataclass(frozen=True)
class Field:
    """One ``|``-separated field of the step line; lower ``rank`` = dropped later when space is short."""

    text: str
    rank: int


def progress_fields(
    step: int, total: int, metrics: dict[str, float], discarded: int, cancelled: int, eta_s: float | None
) -> list[Field]:
    """The step line's fields in display order. The step counter and the ETA (rank 0) are never dropped."""
    reward = _first(metrics, REWARD_KEYS)
    step_time = _first(metrics, STEP_TIME_KEYS)
    tps = _first(metrics, TOKENS_PER_S_KEYS)
    async_level = _first(metrics, ASYNC_KEYS)
    infra = summary(metrics)  # only when the infrastructure failed under a sample
    return [
        Field(f"step {step}/{total}", 0),
        Field(f"ETA {format_duration(eta_s)}", 0),
        Field(f"reward {reward:.4f}" if reward is not None else "reward -", 1),
        Field(f"step {step_time:.2f}s" if step_time is not None else "step -", 3),
        Field(f"{tps:,.0f} tok/s" if tps is not None else "- tok/s", 4),
        Field(f"async {async_level:.0f}" if async_level is not None else "async -", 5),
        Field(f"discarded {discarded}", 2),
        Field(f"cancelled {cancelled}", 2),
        *([Field(infra, 2)] if infra else []),
    ]


def fit_fields(fields: list[Field], width: int | None) -> str:
    """The fields joined by `` | ``, dropping the highest-ranked ones until the line fits ``width``
    (None = no limit). Rank-0 fields stay even when they alone are wider."""
    kept = list(fields)
    while width is not None and len(SEPARATOR.join(f.text for f in kept)) > width:
        droppable = [f for f in kept if f.rank > 0]
        if not droppable:
            break
        top = max(f.rank for f in droppable)
        kept.pop(max(i for i, f in enumerate(kept) if f.rank == top))  # of equal ranks, the last goes first
    return SEPARATOR.join(f.text for f in kept)


def format_progress(
    step: int, total: int, metrics: dict[str, float], discarded: int, cancelled: int, eta_s: float | None
) -> str:
    """The one-line step summary, every field (plain output, telescope.log)."""
    return fit_fields(progress_fields(step, total, metrics, discarded, cancelled, eta_s), None)


@dataclass(frozen=True)
class StepLine:
    """What one finished step shows: ``done`` of ``total`` steps, its fields, and when it was logged."""

    done: int
    total: int
    fields: list[Field]
    eta_s: float | None
    at: float

    def text(self, width: int | None = None) -> str:
        return fit_fields(self.fields, width)


class StepProgress:
    """Counts steps, discarded and cancelled samples, and the ETA, from ``log_step`` calls.

    Steps are taken as 1-based unless a step 0 is logged (then ``step + 1`` steps are done).
    The ETA uses step times only: the mean wall time between the step completions seen in
    this process, so it is unknown (``?``) until the second one. Start-up (Ray, servers,
    loading the model) is excluded; the first step's own ``perf/step_time_s`` would not be
    (it counts from the start of the run: 117 s of a 2-minute quickstart).
    """

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = int(total)
        self.discarded = 0
        self.cancelled = 0
        self._clock = clock
        self._zero_based = False
        self._first: tuple[int, float] | None = None  # (steps done, time) at the first completion seen

    def eta_seconds(self, done: int, now: float) -> float | None:
        """Seconds left after ``done`` steps at ``now`` (None = not known yet)."""
        if self._first is None or not self.total:
            return None
        first_done, first_at = self._first
        if done <= first_done:
            return None
        per_step = (now - first_at) / (done - first_done)
        return per_step * max(self.total - done, 0)

    def update(self, step: int, metrics: dict[str, float]) -> StepLine:
        """Count step ``step`` as finished now; its line."""
        now = self._clock()
        self._zero_based = self._zero_based or step == 0
        done = step + 1 if self._zero_based else step
        if self._first is None:
            self._first = (done, now)
        self.discarded += int(metrics.get("discarded/count", 0) or 0)
        self.cancelled += int(metrics.get("cancelled/count", 0) or 0)
        eta = self.eta_seconds(done, now)
        fields = progress_fields(done, self.total, metrics, self.discarded, self.cancelled, eta)
        return StepLine(done, self.total, fields, eta, now)
