"""Frozen inference servers: samples unanswered far beyond the recent generation times, /health silent.

A server that dies is noticed by the requests that fail (``servers.py``); a *frozen* one (SIGSTOP,
a deadlocked engine, a machine swapping to death) fails nothing: its connections stay open and
the client waits its hour. The orchestrator records when each sample's generation ends
(``AnswerClock``); ``InferenceSupervisor.watch`` asks every few seconds, per server, how long its
generating samples have gone without an answer: the time since the newer of its last answer and
the start of its oldest generating sample. Past ``overdue_limit`` (the trainer's rule:
``max(inference_overdue_factor x the median recent generation time, inference_overdue_floor_s)``)
the server's ``/health`` is asked; no answer there either and the server is frozen: one line says
which server (pid, node), how long it has been silent and what it was doing, then it is killed
(SIGKILL: a stopped process cannot exit when asked) and restarted like a dead one, its groups
re-queued to the servers that answer. A server overdue but answering ``/health`` only gets a
warning (slow generations are not a fault), and the stall watchdog stays in charge.

No generation timed yet (the first ones hold the warm-up): the rule waits, the watchdog covers.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from telescope.core.observe.loggers.progress import format_seconds
from telescope.core.runtime.supervision.heartbeat import overdue_limit

if TYPE_CHECKING:
    from telescope.core.runtime.supervision.liveness import RunSnapshot

__all__ = ["RECENT_ANSWERS", "AnswerClock", "Silence", "server_silence", "silent_servers"]

RECENT_ANSWERS = 64
"""How many of the latest generation times the median is taken over (all servers together)."""


class AnswerClock:
    """When each server last answered a sample, and how long the recent generations took."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=RECENT_ANSWERS)
        self.last_answer: dict[int, float] = {}

    def answered(self, server: int, started: float, now: float | None = None) -> None:
        """A sample dispatched to ``server`` at ``started`` finished generating (``time.time()`` clock)."""
        now = time.time() if now is None else now
        self.recent.append(max(0.0, now - started))
        self.last_answer[server] = max(now, self.last_answer.get(server, now))


@dataclass(frozen=True)
class Silence:
    """A server whose generating samples have gone unanswered past the limit."""

    server: int
    silent_s: float
    """Seconds since the newer of its last answer and the start of its oldest generating sample."""
    generating: int
    """Samples generating on it."""
    oldest_s: float
    """Age of its oldest generating sample."""
    last_answer_ago: float | None
    """Seconds since it last answered a sample (None: never)."""
    limit_s: float
    median_s: float
    factor: float
    floor_s: float

    def describe(self) -> str:
        """``has not answered for 45s: 8 samples generating, the oldest for 47s, ... (inference_overdue_factor, ...)``."""
        last = (
            f"its last answer {format_seconds(self.last_answer_ago)} ago"
            if self.last_answer_ago is not None
            else "no answer yet"
        )
        return (
            f"has not answered for {format_seconds(self.silent_s)}: {self.generating} samples generating, "
            f"the oldest for {format_seconds(self.oldest_s)}, {last}; more than max({self.factor:g} x median "
            f"generation {format_seconds(self.median_s)}, {self.floor_s:g}s) "
            "(inference_overdue_factor, inference_overdue_floor_s)"
        )


def server_silence(
    server: int,
    generating_since: Sequence[float],
    last_answer: float | None,
    recent: Sequence[float],
    factor: float,
    floor_s: float,
    now: float,
) -> Silence | None:
    """The overdue rule for one server at ``now``: a ``Silence`` when it applies, else None.

    ``generating_since``: when each sample generating on it started. Nothing generating, no
    generation timed yet or ``factor`` 0: None.
    """
    limit = overdue_limit(recent, factor, floor_s)
    if limit is None or not generating_since:
        return None
    oldest = min(generating_since)
    # Silence starts at the newer of the two: a server that answered a second ago is not silent
    # because an old sample still runs; one idle for an hour is not silent because it answered
    # nothing while it had no work.
    since = oldest if last_answer is None else max(oldest, last_answer)
    silent = now - since
    if silent <= limit:
        return None
    ago = None if last_answer is None else now - last_answer
    median = statistics.median(recent)
    return Silence(server, silent, len(generating_since), now - oldest, ago, limit, median, factor, floor_s)


def silent_servers(
    snap: RunSnapshot, clock: AnswerClock, factor: float, floor_s: float, now: float
) -> list[Silence]:
    """Every server the rule applies to, from the orchestrator's snapshot of the groups in flight."""
    since: dict[int, list[float]] = {}
    for group in snap.groups:
        for sample in group.running:
            if sample.generating:
                since.setdefault(group.server, []).append(sample.started)
    found = []
    for server, starts in sorted(since.items()):
        silence = server_silence(
            server, starts, clock.last_answer.get(server), clock.recent, factor, floor_s, now
        )
        if silence is not None:
            found.append(silence)
    return found
