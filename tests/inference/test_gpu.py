"""GPU checks (skipped without CUDA; not run on Telescope's CPU CI)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from telescope.core.inference.client import InferenceClient
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg


@pytest.mark.gpu
def test_transformers_engine_on_cuda_matches_teacher_forcing(tiny_path: str) -> None:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    srv = start_in_thread(
        make_cfg(gpu_memory_utilization=0.5), TransformersEngineKwargs(device="cuda"), port=free_port()
    )
    try:

        async def go():  # type: ignore[no-untyped-def]
            async with InferenceClient(srv.url) as client:
                return await client.complete([5, 6, 7], max_tokens=8, temperature=0.8, ignore_eos=True)

        out = asyncio.run(go())[0]
        model = srv.state.engine.model
        with torch.no_grad():
            logits = model(torch.tensor([[5, 6, 7] + out.token_ids], device="cuda")).logits[0].float()
        expected = torch.log_softmax(logits / 0.8, -1)[2:-1].gather(
            1, torch.tensor(out.token_ids, device="cuda")[:, None]
        )
        assert torch.allclose(torch.tensor(out.logprobs), expected.squeeze(1).cpu(), atol=1e-4, rtol=0)
    finally:
        srv.stop()


@pytest.mark.gpu
def test_vllm_serves_the_synced_lora_adapter(tiny_path: str, tmp_path: Any) -> None:
    """A LoRA run on vLLM (issue #31): the servers start on the base model, an adapter-only sync is
    verified by fingerprint, reloaded in place, and from then on requests sample the adapter: greedy
    output changes, and the sampled tokens' logprobs are the trainer-side peft model's."""
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from telescope.core.testing import join_local_sync_group, small_vllm_engine
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.lora import adapter_parameters, inject_lora
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.verify import check_sync

    engine = small_vllm_engine(lora_rank=8, lora_alpha=16.0, inference_dtype="bfloat16")
    cfg = engine.cfg
    torch.manual_seed(0)
    model = inject_lora(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16), cfg).cuda()
    with torch.no_grad():  # a trained adapter: lora_B away from its zero start
        for name, param in adapter_parameters(model).items():
            if ".lora_B." in name:
                param.normal_(0, 0.5)
    prompt = [1, 2, 3, 4]
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(tmp_path))
    try:

        async def go():  # type: ignore[no-untyped-def]
            async with engine.client(server.url) as client:
                (before,) = await client.complete(prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
                group = await join_local_sync_group(client)
                sender = WeightSender(group, WeightSyncSettings(dtype="bfloat16"))
                named = [(n, p.detach().cpu()) for n, p in adapter_parameters(model).items()]
                update = asyncio.create_task(client.update_weights(1))
                report = await asyncio.to_thread(sender.send, iter(named), 1)
                response = await update
                check_sync(report.fingerprints, {server.url: response.fingerprints}, 1)
                assert client.lora_loaded
                (greedy,) = await client.complete(prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
                (sampled,) = await client.complete(prompt, max_tokens=12, temperature=1.0, ignore_eos=True)
                return before, greedy, sampled

        before, greedy, sampled = asyncio.run(go())
    finally:
        server.stop()
    assert greedy.token_ids != before.token_ids, "the adapter did not change greedy output"
    with torch.no_grad():
        ids = torch.tensor([prompt + sampled.token_ids], device="cuda")
        logits = model(ids).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
        1, torch.tensor(sampled.token_ids, device="cuda")[:, None]
    )
    assert torch.allclose(torch.tensor(sampled.logprobs), expected.squeeze(1).cpu(), atol=5e-2, rtol=0)
