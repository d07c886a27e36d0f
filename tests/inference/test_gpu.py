"""GPU checks (skipped without CUDA; not run on Telescope's CPU CI)."""

from __future__ import annotations

import asyncio

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
