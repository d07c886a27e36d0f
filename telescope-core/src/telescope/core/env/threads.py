"""Running blocking callables off the event loop on daemon threads.

Rewards and tools may hang. ``asyncio.to_thread`` uses non-daemon executor threads that the
interpreter joins at exit, so one stuck reward would block shutdown forever. This pool's
workers are daemon threads: a call that times out is abandoned (its worker stays busy until
the call returns) and never holds the process open. Workers are started on demand up to
``max_workers``; if every worker is stuck, new calls wait and hit their own timeouts.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonThreadPool", "run_in_daemon_thread"]

_Job = tuple[
    Callable[..., Any], tuple[Any, ...], dict[str, Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"
]


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

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            func, args, kwargs, loop, fut = self._jobs.get()
            with self._lock:
                self._idle -= 1
            try:
                result, error = func(*args, **kwargs), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._idle > self._jobs.qsize() or self._workers >= self.max_workers:
                return
            self._workers += 1
            index = self._workers
        threading.Thread(target=self._work, name=f"{self.name}-{index}", daemon=True).start()

    async def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await ``func(*args, **kwargs)`` run on a pool thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((func, args, kwargs, loop, fut))
        self._ensure_worker()
        return await fut


_shared = DaemonThreadPool()


async def run_in_daemon_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``func(*args, **kwargs)`` on the process-wide daemon pool."""
    return await _shared.run(func, *args, **kwargs)
