"""Time-driven helpers: a buffer flushed at an interval, and a background thread that ticks.

Both take an injectable ``clock`` so tests drive time by hand instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["IntervalBuffer", "IntervalGate", "PeriodicThread"]

_log = logging.getLogger("telescope.observe")
T = TypeVar("T")


class IntervalGate:
    """``due(now)`` is True at most once per ``interval_s`` (the first call after it elapses)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval {interval_s!r} must be > 0 seconds")
        self.interval_s = float(interval_s)
        self._clock = clock
        self._last = clock()

    def due(self) -> bool:
        now = self._clock()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True


class IntervalBuffer(Generic[T]):
    """Items collected in memory and handed to ``sink(items)`` once per ``interval_s``.

    ``add`` never calls the sink itself unless ``max_items`` is reached (bounded memory: then
    the caller waits for the hand-over, back-pressure rather than dropping items);
    ``tick`` (from a background thread) hands over what is due; ``flush`` hands over now.
    The items are swapped out under a short lock and the sink runs outside it, so a slow sink
    (a remote tracking server) never blocks ``add`` on the run's hot path; a second lock
    serialises hand-overs, so they never interleave or reorder. An exception from the sink
    propagates to the caller of ``tick``/``flush`` (the hub's tick thread logs it).
    """

    def __init__(
        self,
        sink: Callable[[list[T]], Any],
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_items: int = 10_000,
    ) -> None:
        self._sink = sink
        self._gate = IntervalGate(interval_s, clock)
        self._max_items = max_items
        self._items: list[T] = []
        self._lock = threading.Lock()  # guards _items only; never held while the sink runs
        self._send_lock = threading.Lock()  # one hand-over at a time, in swap order
        self.flushes = 0
        """Number of non-empty hand-overs so far."""

    def add(self, *items: T) -> None:
        with self._lock:
            self._items.extend(items)
            full = len(self._items) >= self._max_items
        if full:
            self.flush()

    def tick(self) -> None:
        """Hand over the buffered items when ``interval_s`` has passed since the last tick hand-over."""
        with self._lock:
            due = self._gate.due()
        if due:
            self.flush()

    def flush(self) -> None:
        with self._send_lock:
            with self._lock:
                items, self._items = self._items, []
            if items:
                self.flushes += 1
                self._sink(items)

    def __len__(self) -> int:
        return len(self._items)


class PeriodicThread:
    """A daemon thread calling ``fn()`` every ``interval_s`` seconds until ``stop()``.

    An exception in ``fn`` is logged (once per distinct message) and the thread goes on.
    """

    def __init__(self, fn: Callable[[], Any], interval_s: float, name: str) -> None:
        if interval_s <= 0:
            raise ValueError(f"{name}: interval {interval_s!r} must be > 0 seconds")
        self._fn = fn
        self._interval = float(interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._seen: set[str] = set()
        self.calls = 0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._fn()
                self.calls += 1
            except Exception as exc:  # noqa: BLE001 - a background observer must never kill the run
                msg = f"{self._thread.name}: {type(exc).__name__}: {exc}"
                if msg not in self._seen:
                    self._seen.add(msg)
                    _log.warning("%s (repeats are not logged)", msg)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)
