"""Step timing: ``timing_<name>_total`` per step and ``timing_<name>_microbatch_mean``.

A phase may be tracked in several intervals per micro-batch (the loss computation is split
around the KL): set ``num_micro_batches`` and the mean is the total over that count.

On CUDA, intervals are CUDA events resolved once at the end of the step (one synchronise
per step, none per micro-batch); on CPU they are ``perf_counter`` readings.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["StepTimer"]


class StepTimer:
    """Collects named intervals during one training step."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: dict[str, list[Any]] = defaultdict(list)
        self._per_micro_batch: set[str] = set()
        self.num_micro_batches: int | None = None
        """Micro-batches of the step (divides ``*_microbatch_mean``); None = one interval each."""

    @contextmanager
    def track(self, name: str, *, micro_batch: bool = False) -> Iterator[None]:
        """Time the block under ``name``; ``micro_batch=True`` also reports a per-micro-batch mean."""
        if micro_batch:
            self._per_micro_batch.add(name)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending[name].append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._pending[name].append(time.perf_counter() - t0)

    def add_seconds(self, name: str, seconds: float) -> None:
        """Record an interval measured elsewhere (e.g. the weight gather between steps)."""
        self._pending[name].append(float(seconds))

    def metrics(self) -> dict[str, float]:
        """Resolve every interval (synchronises CUDA once) and return the timing metrics."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for name, items in self._pending.items():
            seconds = [x if isinstance(x, float) else x[0].elapsed_time(x[1]) / 1000.0 for x in items]
            out[f"timing_{name}_total"] = sum(seconds)
            if name in self._per_micro_batch:
                count = self.num_micro_batches or len(seconds)
                out[f"timing_{name}_microbatch_mean"] = sum(seconds) / count
        return out
