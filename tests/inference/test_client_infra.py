"""The inference client decides where a request fails: a server error (5xx) or a server that died
mid-request is the infrastructure's (marked and counted: the sample is retried, never scored); a
request the server refuses (4xx) is not."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from telescope.core import infra
from telescope.core.inference.client import InferenceClient, InferenceServerError


async def _complete_against(handler: Any) -> BaseException:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with InferenceClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(Exception) as raised:
                await client.complete([1, 2, 3], max_tokens=4, request_id="g0-s0-v0")
            return raised.value
    finally:
        await runner.cleanup()


async def overloaded(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "engine dead"}}, status=503)


async def refused(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "max_tokens must be positive"}}, status=400)


async def dies(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_length = 1000
    await response.prepare(request)
    await response.write(b'{"choices": [')
    request.transport.close()  # type: ignore[union-attr]  # the process died mid-answer
    return response


@pytest.mark.parametrize(("handler", "cause"), [(overloaded, "server_error"), (dies, "server_died")])
def test_server_failures_are_the_infrastructures(handler: Any, cause: str) -> None:
    infra.ORIGINS.drain()
    error = asyncio.run(_complete_against(handler))
    marked = infra.infra_cause(error)
    assert marked is not None and (marked.cause, marked.provider) == (cause, "inference")
    assert isinstance(error, InferenceServerError | aiohttp.ClientError)  # callers' classes unchanged
    assert {(o.cause, n) for o, n in infra.ORIGINS.drain().items()} == {(cause, 1)}


def test_a_refused_request_is_not() -> None:
    infra.ORIGINS.drain()
    error = asyncio.run(_complete_against(refused))
    assert isinstance(error, InferenceServerError) and error.status == 400
    assert infra.infra_cause(error) is None and not infra.ORIGINS.drain()
