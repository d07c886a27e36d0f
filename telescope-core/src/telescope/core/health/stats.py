"""Robust statistics of one signal's recent history: the median and a MAD-based spread."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from telescope.core.observe.stats import median

__all__ = ["MAD_TO_SIGMA", "Baseline", "History"]

MAD_TO_SIGMA = 1.4826
"""MAD x this estimates the standard deviation of normally distributed values."""


@dataclass(frozen=True)
class Baseline:
    """What a signal's recent healthy steps looked like."""

    median: float
    sigma: float
    """``MAD_TO_SIGMA`` x the median absolute deviation from ``median``."""
    first_step: int
    last_step: int
    count: int

    def steps(self) -> str:
        """The steps it summarises, e.g. ``steps 3-12``."""
        if self.first_step == self.last_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"


class History:
    """The last ``size`` healthy values of one signal, with the step each came from."""

    def __init__(self, size: int, first_only: bool = False) -> None:
        """``first_only``: keep the first ``size`` values instead of the last (the run's starting level)."""
        self._values: deque[tuple[int, float]] = deque(maxlen=size)
        self.first_only = first_only

    def __len__(self) -> int:
        return len(self._values)

    def add(self, step: int, value: float) -> None:
        if not (self.first_only and len(self._values) == self._values.maxlen):
            self._values.append((step, value))

    def drop_after(self, step: int) -> None:
        """Forget the values of steps after ``step`` (a rollback re-runs them)."""
        kept = [(s, v) for s, v in self._values if s <= step]
        self._values.clear()
        self._values.extend(kept)

    def baseline(self) -> Baseline | None:
        """Median and spread of the values kept, or None while there are none."""
        if not self._values:
            return None
        values = [v for _, v in self._values]
        mid = median(values)
        mad = median([abs(v - mid) for v in values])
        steps = [s for s, _ in self._values]
        return Baseline(mid, MAD_TO_SIGMA * mad, min(steps), max(steps), len(values))
