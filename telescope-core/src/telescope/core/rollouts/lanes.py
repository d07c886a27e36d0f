"""Lane slots per inference server: how many requests may run on each at once."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Lanes", "QueuedSample", "ReadySample"]


@dataclass(frozen=True)
class QueuedSample:
    """A sample waiting for a lane on its group's server."""

    group_id: int
    index: int


@dataclass(frozen=True)
class ReadySample:
    """A queued sample that can start now, on the lane slot acquired for it."""

    server: int
    slot: int
    sample: QueuedSample


@dataclass
class _Server:
    free: list[int]
    queue: deque[QueuedSample] = field(default_factory=deque)
    enabled: bool = True


class Lanes:
    """Slots ``0..slots-1`` per server; the smallest free slot is reused (a tidy timeline)."""

    def __init__(self, num_servers: int, slots_per_server: int) -> None:
        self.slots_per_server = slots_per_server
        self._servers = [_Server(free=list(range(slots_per_server))) for _ in range(num_servers)]

    @property
    def num_servers(self) -> int:
        return len(self._servers)

    def queued_count(self, server: int | None = None) -> int:
        if server is not None:
            return len(self._servers[server].queue)
        return sum(len(s.queue) for s in self._servers)

    def free_count(self, server: int) -> int:
        return len(self._servers[server].free)

    def enabled(self, server: int) -> bool:
        return self._servers[server].enabled

    def pick_server(self, need: int) -> int | None:
        """The server with the most free slots beyond its queue, if it has ``need`` of them."""
        best, best_room = None, need - 1
        for i, s in enumerate(self._servers):
            room = len(s.free) - len(s.queue)
            if s.enabled and room > best_room:
                best, best_room = i, room
        return best

    def set_enabled(self, servers: set[int], enabled: bool) -> None:
        """A disabled server gets no new groups (e.g. while it runs evals)."""
        for i in servers:
            self._servers[i].enabled = enabled

    def acquire(self, server: int) -> int:
        return heapq.heappop(self._servers[server].free)

    def release(self, server: int, slot: int) -> None:
        heapq.heappush(self._servers[server].free, slot)

    def enqueue(self, server: int, item: QueuedSample) -> None:
        self._servers[server].queue.append(item)

    def pop_ready(self) -> list[ReadySample]:
        """Queued samples that can start now, each with the slot acquired for it."""
        ready = []
        for i, s in enumerate(self._servers):
            while s.queue and s.free:
                ready.append(ReadySample(i, heapq.heappop(s.free), s.queue.popleft()))
        return ready

    def drop_group(self, group_id: int) -> int:
        """Remove a group's queued samples; returns how many were removed."""
        removed = 0
        for s in self._servers:
            keep = deque(q for q in s.queue if q.group_id != group_id)
            removed += len(s.queue) - len(keep)
            s.queue = keep
        return removed
