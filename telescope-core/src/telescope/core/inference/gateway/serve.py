"""Run a gateway: on the current event loop (``start_gateway``) or on a thread of its own (``GatewayThread``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from telescope.core.inference.gateway.app import Gateway

__all__ = ["GatewayThread", "start_gateway"]


async def start_gateway(
    gateway: Gateway, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``gateway`` on ``host:port`` (0: a free port) from this loop; returns (runner, base URL
    ending in ``/v1``). Stop it with ``await runner.cleanup()``."""
    runner = web.AppRunner(gateway.app(host), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if port == 0 else port
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return runner, f"http://{reach}:{bound}/v1"


class GatewayThread:
    """A gateway on its own event-loop thread (``make`` builds it there, so its engine client's HTTP
    session belongs to that loop)."""

    def __init__(self, make: Callable[[], Gateway], host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.gateway: Gateway
        self.url = ""
        self._thread = threading.Thread(target=self._run, args=(make, host, port), daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the gateway on {host}:{port} did not start within 60s")
        if self._error is not None:
            raise self._error

    def _run(self, make: Callable[[], Gateway], host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.gateway = make()
            self._runner, self.url = self._loop.run_until_complete(start_gateway(self.gateway, host, port))
        except BaseException as exc:  # noqa: BLE001 (re-raised in the starting thread)
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the gateway's loop (capture sessions are opened and closed there)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def stop(self) -> None:
        """Stop serving and close the engine client."""

        async def close() -> None:
            await self._runner.cleanup()
            await self.gateway.client.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
