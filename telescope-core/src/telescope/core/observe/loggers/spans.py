"""Timeline spans as per-step durations, for loggers that show scalars but no timeline.

A span is a ``start`` and an ``end`` event with the same type, name and ids (group, sample,
server, lane, rank). The step is not part of the match: the orchestrator stamps a
generation's events with the step being filled when each is emitted, which may move on
while the rollout runs; the span counts for the step of its ``start``. An ``end`` whose
``attrs`` carry ``duration_s`` (``LoggerHub.span``) needs no ``start``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from telescope.core.observe.loggers.tables import markdown_table
from telescope.core.observe.rundir.records import TimelineEvent

__all__ = ["SpanStats", "SpanTimes", "span_label"]

_Key = tuple[str, str, int | None, int | None, int | None, int | None, int | None]


def span_label(event: TimelineEvent) -> str:
    """``<type>`` or ``<type>/<name>`` (``trainer/train_step``, ``generation``)."""
    return f"{event.type}/{event.name}" if event.name else event.type


@dataclass
class SpanStats:
    """Durations of the spans of one label (in one step, or over the run)."""

    label: str
    step: int | None = None
    """The step (None for a run total)."""
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0

    def add(self, duration_s: float) -> None:
        self.count += 1
        self.total_s += duration_s
        self.max_s = max(self.max_s, duration_s)

    def scalars(self) -> dict[str, float]:
        """``timeline/<label>/{mean_s,max_s,count}``: what a scalar dashboard plots per step."""
        base = f"timeline/{self.label}"
        return {
            f"{base}/mean_s": self.mean_s,
            f"{base}/max_s": self.max_s,
            f"{base}/count": float(self.count),
        }


class SpanTimes:
    """Pairs ``start``/``end`` events into durations kept per (step, label) until taken.

    Args:
        max_open: starts waiting for their end (a cancelled rollout's never comes); past it
            the oldest are dropped and counted in ``dropped``.
    """

    def __init__(self, max_open: int = 100_000) -> None:
        self._open: dict[_Key, TimelineEvent] = {}
        self._pending: dict[tuple[int, str], SpanStats] = {}
        self._totals: dict[str, SpanStats] = {}
        self._max_open = max_open
        self._lock = threading.Lock()
        self.dropped = 0
        """Starts dropped unmatched (``max_open`` reached)."""

    @staticmethod
    def _key(e: TimelineEvent) -> _Key:
        return (e.type, e.name, e.group_id, e.sample_id, e.server, e.lane, e.rank)

    def add(self, events: Iterable[TimelineEvent]) -> None:
        with self._lock:
            for event in events:
                if event.phase == "start":
                    self._start(event)
                elif event.phase == "end":
                    self._end(event)

    def _start(self, event: TimelineEvent) -> None:
        self._open[self._key(event)] = event
        if len(self._open) > self._max_open:
            del self._open[next(iter(self._open))]
            self.dropped += 1

    def _end(self, event: TimelineEvent) -> None:
        start = self._open.pop(self._key(event), None)
        duration = event.attrs.get("duration_s")
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            seconds = float(duration)
        elif start is not None:
            seconds = max(event.time - start.time, 0.0)
        else:
            return  # an end without its start (emitted before a resume): nothing to measure
        step = (start or event).step
        label = span_label(event)
        if step is not None:
            self._pending.setdefault((step, label), SpanStats(label, step)).add(seconds)
        self._totals.setdefault(label, SpanStats(label)).add(seconds)

    def take(self, upto_step: int | None = None) -> list[SpanStats]:
        """The per-step stats of steps ``<= upto_step`` (all when None), removed, by step then label."""
        with self._lock:
            keys = sorted(k for k in self._pending if upto_step is None or k[0] <= upto_step)
            return [self._pending.pop(k) for k in keys]

    def totals(self) -> list[SpanStats]:
        """Run totals per label, the longest total first."""
        with self._lock:
            return sorted(self._totals.values(), key=lambda s: (-s.total_s, s.label))

    def summary_markdown(self) -> str:
        """The run totals as a Markdown table (label, count, total, mean and max seconds)."""
        rows = [
            [s.label, s.count, f"{s.total_s:.3f}", f"{s.mean_s:.3f}", f"{s.max_s:.3f}"] for s in self.totals()
        ]
        return markdown_table(["span", "count", "total_s", "mean_s", "max_s"], rows)
