"""The server's request log when ``inference_access_log`` is off: one summary line per interval.

aiohttp's access log writes a line per request (651 lines for a 5-step run, mostly
``/health`` and weight updates), burying the lines that matter in ``server_N.log``. Instead
a middleware counts requests by route and errors, and a line like
``requests in the last 60 s: 412 (POST /v1/completions 380, GET /health 30, ...); errors 0``
is logged once per interval (nothing when idle) and once more when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = ["RequestSummary", "server_logging"]

log = logging.getLogger("telescope.inference.requests")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RequestSummary:
    """Counts requests (by method and route) and errors (HTTP 5xx or an exception) between summaries."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = float(interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._by_route: Counter[str] = Counter()
        self._errors = 0
        self._since = clock()
        self._task: asyncio.Task[None] | None = None

    def count(self, route: str, status: int) -> None:
        with self._lock:
            self._by_route[route] += 1
            self._errors += int(status >= 500)

    def take_line(self) -> str | None:
        """The summary since the last one (and start a new interval); None when nothing was requested."""
        now = self._clock()
        with self._lock:
            by_route, errors, since = self._by_route, self._errors, self._since
            self._by_route, self._errors, self._since = Counter(), 0, now
        total = sum(by_route.values())
        if not total:
            return None
        routes = ", ".join(f"{route} {n}" for route, n in by_route.most_common())
        return f"requests in the last {now - since:.0f} s: {total} ({routes}); errors {errors}"

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = f"{request.method} {resource.canonical if resource is not None else request.path}"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.count(route, exc.status)
            raise
        except asyncio.CancelledError:  # the client went away (a cancelled rollout): not a server error
            self.count(route, 499)
            raise
        except BaseException:
            self.count(route, 500)
            raise
        self.count(route, response.status)
        return response

    def install(self, app: web.Application) -> None:
        """Count ``app``'s requests and log the summaries while it runs (call before it starts)."""
        app.middlewares.append(self.middleware)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _stop(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._emit()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._emit()

    def _emit(self) -> None:
        line = self.take_line()
        if line is not None:
            log.info(line)


def server_logging(app: web.Application, access_log: bool, interval_s: float = 60.0) -> dict[str, Any]:
    """``web.run_app`` keyword arguments for ``inference_access_log``: aiohttp's access log, or the summary."""
    if access_log:
        return {}
    RequestSummary(interval_s).install(app)
    return {"access_log": None}
