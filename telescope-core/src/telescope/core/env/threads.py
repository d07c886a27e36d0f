"""Running blocking callables off the event loop on daemon threads.

Rewards and tools may hang. ``asyncio.to_thread`` uses non-daemon executor threads that the
interpreter joins at exit, so one stuck reward would block shutdown forever. This pool's
workers are daemon threads: a call that times out is abandoned (its worker stays busy until
the call returns) and never holds the process open. Workers are started on demand up to
``max_workers``; if every worker is stuck, new calls wait and hit their own timeouts.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonThreadPool", "run_in_daemon_thread"]


class _Inbox:
    """Results finished on pool threads for one event loop, handed over in batches.

    A worker appends its result and wakes the loop only when no hand-over is pending: with
    thousands of rewards a second, one wake-up (a write to the loop's self-pipe and a turn of
    its selector) per batch instead of one per call (``bench/scale.py``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the pool's map of inboxes must not keep a loop alive
        self._done: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = (
            collections.deque()
        )
        self._scheduled = False

    def serves(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._loop() is loop

    def put(self, fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        """From a worker thread."""
        self._done.append((fut, result, error))
        if not self._scheduled:
            self._scheduled = True  # two workers may both get here: a second drain finds nothing
            loop = self._loop()
            try:
                if loop is not None:
                    loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _drain(self) -> None:
        """On the loop: settle every finished call (a result put while this runs is settled too,
        or schedules the next drain: ``_scheduled`` is cleared first)."""
        self._scheduled = False
        done = self._done
        while done:
            _settle(*done.popleft())


_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], _Inbox, "asyncio.Future[Any]"]


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():  # the caller timed out or was cancelled: drop the late result
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class DaemonThreadPool:
    """A growable pool of daemon worker threads serving asyncio callers."""

    def __init__(self, max_workers: int = 16, name: str = "telescope-reward") -> None:
        self.max_workers = max_workers
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._idle = 0
        self._inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = (
            weakref.WeakKeyDictionary()
        )
        self._last: _Inbox | None = None

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            func, args, kwargs, inbox, fut = self._jobs.get()
            with self._lock:
                self._idle -= 1
            try:
                result, error = func(*args, **kwargs), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            inbox.put(fut, result, error)
            # an idle worker holds none of its last call's objects (nor, through the future, its loop)
            del func, args, kwargs, inbox, fut, result, error

    def _ensure_worker(self) -> None:
        if self._workers >= self.max_workers:  # the common case, read without the lock (it only grows)
            return
        with self._lock:
            if self._idle > self._jobs.qsize() or self._workers >= self.max_workers:
                return
            self._workers += 1
            index = self._workers
        threading.Thread(target=self._work, name=f"{self.name}-{index}", daemon=True).start()

    def _inbox(self, loop: asyncio.AbstractEventLoop) -> _Inbox:
        inbox = self._last
        if inbox is not None and inbox.serves(loop):  # the common case: one loop calls again and again
            return inbox
        with self._lock:
            inbox = self._inboxes.setdefault(loop, _Inbox(loop))
        self._last = inbox
        return inbox

    async def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await ``func(*args, **kwargs)`` run on a pool thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((func, args, kwargs, self._inbox(loop), fut))
        self._ensure_worker()
        return await fut


_shared = DaemonThreadPool()


async def run_in_daemon_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``func(*args, **kwargs)`` on the process-wide daemon pool."""
    return await _shared.run(func, *args, **kwargs)
