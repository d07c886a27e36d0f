"""A pool of warm sandboxes with a concurrency limit and lifetime checks.

Everything runs on the caller's event loop (SDK clients are tied to one loop). ``size``
sandboxes are kept warm; while callers wait, more are created up to ``max_sandboxes``, which
is also the number of sandboxes that can exist (in use + idle + being created) at once.
Sandboxes are reused as they are (files persist between uses): give each use its own
directory. Sandboxes near the end of their lifetime are destroyed instead of handed out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from telescope.core.sandbox.errors import SandboxError, SandboxPoolClosedError, SandboxPoolTimeoutError
from telescope.core.sandbox.provider import SandboxProvider
from telescope.core.sandbox.types import SandboxConfig, SandboxHandle

__all__ = ["SandboxPool"]

_log = logging.getLogger(__name__)


class SandboxPool:
    """``async with SandboxPool(provider, config, size=4) as pool: async with pool.sandbox() as h: ...``"""

    def __init__(
        self,
        provider: SandboxProvider,
        config: SandboxConfig | None = None,
        *,
        size: int = 4,
        max_sandboxes: int | None = None,
        max_concurrent_creates: int = 8,
        min_lifetime_on_acquire: float = 0.1,
        min_lifetime_on_release: float = 0.2,
        max_consecutive_create_failures: int = 3,
    ) -> None:
        max_sandboxes = size if max_sandboxes is None else max_sandboxes
        if size < 0 or max_sandboxes < 1 or size > max_sandboxes:
            raise ValueError(
                f"SandboxPool: need 0 <= size <= max_sandboxes and max_sandboxes >= 1, got "
                f"size={size}, max_sandboxes={max_sandboxes}"
            )
        if max_concurrent_creates < 1:
            raise ValueError(
                f"SandboxPool: max_concurrent_creates must be >= 1, got {max_concurrent_creates}"
            )
        self.provider = provider
        self.config = config if config is not None else SandboxConfig()
        self.size = size
        self.max_sandboxes = max_sandboxes
        self.min_lifetime_on_acquire = min_lifetime_on_acquire
        self.min_lifetime_on_release = min_lifetime_on_release
        self.max_consecutive_create_failures = max_consecutive_create_failures
        self._create_slots = asyncio.Semaphore(max_concurrent_creates)
        self._changed = asyncio.Condition()
        self._idle: list[SandboxHandle] = []
        self._in_use: set[int] = set()
        self._in_use_handles: dict[int, SandboxHandle] = {}
        self._creating = 0
        self._waiters = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._consecutive_failures = 0
        self._last_error: BaseException | None = None
        self.stats = {"created": 0, "destroyed": 0, "create_failures": 0, "retired_for_lifetime": 0}

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> SandboxPool:
        """Begin warming ``size`` sandboxes (returns at once)."""
        self._check_open()
        self._refill()
        return self

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop creating, destroy every sandbox (idle and in use); idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        handles = self._idle + list(self._in_use_handles.values())
        self._idle.clear()
        self._in_use.clear()
        self._in_use_handles.clear()
        await self._destroy_many(handles)
        async with self._changed:
            self._changed.notify_all()

    # ----------------------------------------------------------------- acquire/release
    @property
    def counts(self) -> dict[str, int]:
        """Current ``idle``, ``in_use`` and ``creating`` counts."""
        return {"idle": len(self._idle), "in_use": len(self._in_use), "creating": self._creating}

    async def acquire(self, timeout: float | None = None) -> SandboxHandle:
        """Take a warm sandbox, waiting up to ``timeout`` seconds (None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiters += 1
        try:
            while True:
                self._check_open()
                self._check_failures()
                handle = await self._take_idle()
                if handle is not None:
                    return handle
                self._refill()
                await self._wait_for_change(deadline, timeout)
        finally:
            self._waiters -= 1

    async def release(self, handle: SandboxHandle, *, discard: bool = False) -> None:
        """Return a sandbox; ``discard=True`` (or little lifetime left) destroys it instead."""
        if id(handle) not in self._in_use:
            raise SandboxError(f"sandbox {handle.id} was not acquired from this pool", sandbox_id=handle.id)
        self._in_use.discard(id(handle))
        self._in_use_handles.pop(id(handle), None)
        short_lived = handle.remaining_fraction() < self.min_lifetime_on_release
        if self._closed or discard or handle.destroyed or short_lived:
            self.stats["retired_for_lifetime"] += int(short_lived and not discard)
            await self._destroy_many([handle])
        else:
            self._idle.append(handle)
        self._refill()
        async with self._changed:
            self._changed.notify_all()

    @asynccontextmanager
    async def sandbox(self, timeout: float | None = None) -> AsyncIterator[SandboxHandle]:
        """Acquire, yield, release; a `SandboxError` inside discards the sandbox."""
        handle = await self.acquire(timeout)
        discard = False
        try:
            yield handle
        except SandboxError:
            discard = True
            raise
        finally:
            await self.release(handle, discard=discard)

    # ----------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxPoolClosedError(f"sandbox pool of '{self.provider.name}' is closed")

    def _check_failures(self) -> None:
        if self._consecutive_failures >= self.max_consecutive_create_failures and not self._idle:
            failures, self._consecutive_failures = self._consecutive_failures, 0  # next call retries
            raise SandboxError(
                f"sandbox pool of '{self.provider.name}': {failures} sandbox creations "
                f"failed in a row; last error: {self._last_error}"
            ) from self._last_error

    async def _take_idle(self) -> SandboxHandle | None:
        while self._idle:
            handle = self._idle.pop(0)
            if handle.destroyed:
                continue
            if handle.remaining_fraction() < self.min_lifetime_on_acquire:
                self.stats["retired_for_lifetime"] += 1
                await self._destroy_many([handle])
                continue
            self._in_use.add(id(handle))
            self._in_use_handles[id(handle)] = handle
            self._refill()
            return handle
        return None

    async def _wait_for_change(self, deadline: float | None, timeout: float | None) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise SandboxPoolTimeoutError(
                f"no '{self.provider.name}' sandbox became free within {timeout}s "
                f"({self.counts}, max_sandboxes={self.max_sandboxes})"
            )
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    def _refill(self) -> None:
        if self._closed:
            return
        total = len(self._idle) + len(self._in_use) + self._creating
        want_idle = max(self.size, self._waiters)
        deficit = min(want_idle - len(self._idle) - self._creating, self.max_sandboxes - total)
        for _ in range(max(0, deficit)):
            self._creating += 1
            task = asyncio.get_running_loop().create_task(self._create_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _create_one(self) -> None:
        try:
            async with self._create_slots:
                handle = await self.provider.create(self.config)
        except asyncio.CancelledError:
            self._creating -= 1
            raise
        except Exception as exc:  # noqa: BLE001 - counted; acquire() raises after repeated failures
            self._creating -= 1
            self._on_create_failure(exc)
            await asyncio.sleep(min(0.05 * 2**self._consecutive_failures, 5.0))
        else:
            self._creating -= 1
            self.stats["created"] += 1
            self._consecutive_failures = 0
            if self._closed:
                await self._destroy_many([handle])
            else:
                self._idle.append(handle)
        async with self._changed:
            self._changed.notify_all()
        if self._consecutive_failures < self.max_consecutive_create_failures:
            self._refill()

    def _on_create_failure(self, exc: BaseException) -> None:
        self.stats["create_failures"] += 1
        self._consecutive_failures += 1
        self._last_error = exc
        _log.warning("sandbox pool: creating a '%s' sandbox failed: %s", self.provider.name, exc)

    async def _destroy_many(self, handles: list[SandboxHandle]) -> None:
        if not handles:
            return
        try:
            await self.provider.bulk_destroy(handles)
        except SandboxError as exc:
            _log.warning("sandbox pool: %s", exc)
        self.stats["destroyed"] += len(handles)
