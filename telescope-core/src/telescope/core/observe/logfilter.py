"""Identical warnings, rate-limited with a count.

A failure that repeats (a dead server answering every request with the same error) once
printed 1,728 identical warning lines that buried the one line that mattered. A message
(logger, level and text) already shown is held back for ``window_s`` seconds; the next one
let through after the window says how many were held back. INFO and DEBUG records always
pass; the detailed log keeps everything.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RepeatFilter", "shared_repeat_filter"]

_DECIDED = "telescope_repeat_passed"


class RepeatFilter(logging.Filter):
    """Pass the first of identical WARNING+ records, then at most one per ``window_s`` with a count.

    The decision is stored on the record, so every handler this filter (or another instance)
    is attached to shows or hides the same records.
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = float(window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, _DECIDED, None)
        if decided is not None:
            return bool(decided)
        passed = record.levelno < logging.WARNING or self._decide(record)
        setattr(record, _DECIDED, passed)
        return passed

    def _decide(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = (record.name, record.levelno, text)
        now = self._clock()
        with self._lock:
            shown_at, held = self._last.get(key, (float("-inf"), 0))
            if now - shown_at < self.window_s:
                self._last[key] = (shown_at, held + 1)
                return False
            self._last[key] = (now, 0)
        if held:
            record.msg = f"{text} (repeated {held} more times in the last {self.window_s:.0f} s, not shown)"
            record.args = None
        return True


@functools.cache
def shared_repeat_filter() -> RepeatFilter:
    """The process's filter, shared by the run directory's log and the console."""
    return RepeatFilter()
