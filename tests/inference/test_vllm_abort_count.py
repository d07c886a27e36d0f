"""The run's abort of a stale group on a vLLM server counts the requests closed unanswered.

The orchestrator cancels the group's sample tasks first (``InFlightGroup.cancel``), then awaits the
client's ``abort(ids)`` under ``ABORT_TIMEOUT_S`` (``Orchestrator._abort``): by then the cancelled
tasks may have closed their connections already (``asyncio.wait_for`` runs the abort as a task of
its own on Python 3.11, after them). The same on a real vLLM server, whose log names each abort, is
``test_cancelled_requests_are_aborted_by_vllm_and_counted`` (test_vllm_cpu_control.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from telescope.core.inference.vllm_engine.client import VllmClient
from telescope.core.runtime.orchestrator import ABORT_TIMEOUT_S

from .test_vllm_client import FakeHangingVllm, _serve


def test_requests_cancelled_before_the_abort_are_counted_once() -> None:
    fake = FakeHangingVllm()

    async def go() -> tuple[int, int, list[str], list[Any]]:
        runner, url = await _serve(fake.app())
        try:
            async with VllmClient(url) as client:
                ids = ["g1-s0-v0", "g1-s1-v0-t2", "g2-s0-v0"]
                tasks = [asyncio.create_task(client.complete([1, 2], request_id=i)) for i in ids]
                while len(fake.started) < len(ids):
                    await asyncio.sleep(0.01)
                for task in tasks[:2]:  # the stale group g1's samples
                    task.cancel()
                counted = await asyncio.wait_for(client.abort(["g1-s0-v0", "g1-s1-v0"]), ABORT_TIMEOUT_S)
                again = await client.abort(None)  # g2 is in flight; g1's are counted already
                for _ in range(500):  # the server notices a closed connection within its poll
                    if len(fake.disconnected) >= 3:
                        break
                    await asyncio.sleep(0.01)
                results = await asyncio.gather(*tasks, return_exceptions=True)
                return counted, again, sorted(fake.disconnected), results
        finally:
            await runner.cleanup()

    counted, again, disconnected, results = asyncio.run(go())
    assert counted == 2 and again == 1
    assert disconnected == ["g1-s0-v0", "g1-s1-v0-t2", "g2-s0-v0"]
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
