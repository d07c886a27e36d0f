"""Sequences and the waiting queue of the transformers engine.

A completion request with ``n`` samples over ``k`` prompts becomes ``k * n`` sequences that
share a ``RequestState``. The queue orders waiting sequences by ``(priority, arrival)`` under
the ``priority`` policy (lower value first, ties by arrival, as vLLM) and by arrival under
``fcfs``. Priority orders admission; a running sequence is never preempted.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from telescope.core.inference.transformers_engine.sampling import SamplingParams

__all__ = ["RequestState", "Sequence", "WaitQueue"]


@dataclass
class Sequence:
    """One sample being generated."""

    request: RequestState
    choice_index: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per generated token, its most likely alternatives (filled when ``params.top_logprobs`` > 0)."""
    finish_reason: str | None = None
    weight_versions: list[int] = field(default_factory=list)
    generator_seed: int | None = None

    @property
    def total_len(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class RequestState:
    """A completion request: its sequences, and a callback fired once all of them finish."""

    request_id: str
    priority: int
    on_done: Callable[[RequestState], None]
    sequences: list[Sequence] = field(default_factory=list)
    aborted: bool = False
    _remaining: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark ``seq`` finished; fire ``on_done`` when it was the last one."""
        with self._lock:
            if seq.finish_reason is not None:
                return
            seq.finish_reason = reason
            self._remaining -= 1
            done = self._remaining == 0
        if done:
            self.on_done(self)


class WaitQueue:
    """Thread-safe queue of sequences waiting for a decode slot."""

    def __init__(self, policy: str) -> None:
        if policy not in ("priority", "fcfs"):
            raise ValueError(f"unknown scheduling policy {policy!r}; use 'priority' or 'fcfs'")
        self.policy = policy
        self._heap: list[tuple[int, int, Sequence]] = []
        self._arrival = itertools.count()
        self._lock = threading.Lock()

    def push_request(self, request: RequestState) -> None:
        """Enqueue all sequences of ``request`` (kept together: same priority, consecutive arrivals)."""
        key = request.priority if self.policy == "priority" else 0
        with self._lock:
            for seq in request.sequences:
                heapq.heappush(self._heap, (key, next(self._arrival), seq))

    def pop(self, count: int) -> list[Sequence]:
        """Up to ``count`` sequences in scheduling order (aborted ones are dropped)."""
        out: list[Sequence] = []
        with self._lock:
            while self._heap and len(out) < count:
                _, _, seq = heapq.heappop(self._heap)
                if seq.finish_reason is None:
                    out.append(seq)
        return out

    def remove_request(self, request: RequestState) -> list[Sequence]:
        """Take every waiting sequence of ``request`` out of the queue."""
        with self._lock:
            taken = [s for _, _, s in self._heap if s.request is request]
            self._heap = [e for e in self._heap if e[2].request is not request]
            heapq.heapify(self._heap)
        return taken

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)
