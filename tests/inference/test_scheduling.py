"""Priority order under load, aborts that free the slot, pause/resume (one decode slot per server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from telescope.core.inference.client import InferenceClient
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg


@pytest.fixture(scope="module")
def url(tiny_path: str) -> Iterator[str]:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    srv = start_in_thread(
        make_cfg(vllm_scheduling_policy="priority"),
        TransformersEngineKwargs(max_num_seqs=1),
        port=free_port(),
    )
    yield srv.url
    srv.stop()


async def _wait_for(client: InferenceClient, key: str, value: float) -> None:
    for _ in range(400):
        if (await client.metrics())[key] == value:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{key} never reached {value}")


def test_priority_orders_admission_under_load(url: str) -> None:
    priorities = [5, -2, 3, 0, 9, 1]

    async def go() -> list[int]:
        finished: list[int] = []
        async with InferenceClient(url) as client:
            await client.pause("keep")

            async def one(priority: int) -> None:
                await client.complete([3, 4, 5], max_tokens=3, ignore_eos=True, priority=priority)
                finished.append(priority)

            tasks = [asyncio.create_task(one(p)) for p in priorities]
            await _wait_for(client, "num_requests_waiting", len(priorities))
            await client.resume()
            await asyncio.gather(*tasks)
        return finished

    # One slot: completion order is admission order, which must be priority order (lower first).
    assert asyncio.run(go()) == sorted(priorities)


def test_abort_frees_the_slot_and_returns_partial_output(url: str) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with InferenceClient(url) as client:
            long = asyncio.create_task(
                client.complete([1, 2, 3], max_tokens=400, ignore_eos=True, request_id="long")
            )
            await _wait_for(client, "num_requests_running", 1)
            short = asyncio.create_task(
                client.complete([1, 2], max_tokens=2, ignore_eos=True, request_id="short")
            )
            await _wait_for(client, "num_requests_waiting", 1)
            assert await client.abort(["long"]) == 1
            return await long, await short, await client.metrics()

    long, short, metrics = asyncio.run(go())
    assert long[0].finish_reason == "abort" and 0 < len(long[0].token_ids) < 400
    assert short[0].finish_reason == "length" and len(short[0].token_ids) == 2
    assert metrics["num_requests_running"] == 0 and metrics["num_requests_waiting"] == 0


def test_client_disconnect_aborts_the_request(url: str) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with InferenceClient(url) as client:
            task = asyncio.create_task(client.complete([7, 8], max_tokens=400, ignore_eos=True))
            await _wait_for(client, "num_requests_running", 1)
            task.cancel()
            await _wait_for(client, "num_requests_running", 0)
            return await client.complete([7, 8], max_tokens=2, ignore_eos=True)

    assert len(asyncio.run(go())[0].token_ids) == 2


def test_pause_keep_freezes_and_resume_continues(url: str) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with InferenceClient(url) as client:
            task = asyncio.create_task(client.complete([9, 9], max_tokens=60, ignore_eos=True))
            await _wait_for(client, "num_requests_running", 1)
            await client.pause("keep")
            assert await client.is_paused()
            frozen = (await client.metrics())["generation_tokens_total"]
            await asyncio.sleep(0.3)
            still = (await client.metrics())["generation_tokens_total"]
            await client.resume()
            return frozen, still, await task

    frozen, still, out = asyncio.run(go())
    assert frozen == still  # no decode step while paused
    assert len(out[0].token_ids) == 60 and out[0].finish_reason == "length"
