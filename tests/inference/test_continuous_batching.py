"""Continuous batching keeps every sequence exact: more requests than max_num_seqs, mixed
prompt lengths, sequences admitted while others decode, early finishers leaving the batch.
Each returned logprob must equal a teacher-forced forward of that sequence alone."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from telescope.core.inference.client import InferenceClient
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg


@pytest.fixture(scope="module")
def small_batch_server(tiny_path: str) -> Iterator[SimpleNamespace]:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    srv = start_in_thread(make_cfg(), TransformersEngineKwargs(max_num_seqs=4), port=free_port())
    yield SimpleNamespace(
        url=srv.url,
        model=srv.state.engine.model,
        eos=srv.state.tokenizer.eos_token_id,
        engine=srv.state.engine,
    )
    srv.stop()


def teacher_forced(model, prompt: list[int], completion: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp[len(prompt) - 1 : -1].gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


async def _many(url: str, prompts: list[list[int]], eos: int) -> list:  # type: ignore[type-arg]
    async with InferenceClient(url) as client:
        tasks = [
            client.complete(p, max_tokens=3 + (i * 5) % 14, temperature=1.0, stop_token_ids=[eos], seed=i)
            for i, p in enumerate(prompts)
        ]
        return [c[0] for c in await asyncio.gather(*tasks)]


def test_staggered_admission_keeps_logprobs_exact(small_batch_server: SimpleNamespace) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 300) for _ in range(rng.randint(3, 40))] for _ in range(14)]
    outs = asyncio.run(_many(small_batch_server.url, prompts, small_batch_server.eos))
    worst = 0.0
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids, "every request produced tokens"
        expected = teacher_forced(small_batch_server.model, prompt, out.token_ids)
        worst = max(worst, float((torch.tensor(out.logprobs) - expected).abs().max()))
    assert worst < 1e-5, f"largest logprob error {worst:.2e}"


def _counts(metrics: dict[str, float]) -> tuple[float, float]:
    return metrics["prompt_tokens_total"], metrics["prompt_tokens_computed_total"]


def test_identical_prompts_are_prefilled_once_and_sampled_apart(small_batch_server: SimpleNamespace) -> None:
    """A group's samples share its prompt: one prefill row per distinct prompt, copied per sequence."""
    short, long = [11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26, 27, 28, 29]

    async def run() -> tuple[list, tuple[float, float]]:  # type: ignore[type-arg]
        async with InferenceClient(small_batch_server.url) as client:
            before = _counts(await client.metrics())
            # prompts [short, long] x n=2: four sequences admitted in one prefill (max_num_seqs=4)
            outs = await client.complete(
                [short, long],
                n=2,
                max_tokens=12,
                temperature=1.0,
                seed=3,
                stop_token_ids=[small_batch_server.eos],
            )
            after = _counts(await client.metrics())
            return outs, (after[0] - before[0], after[1] - before[1])

    outs, (admitted, computed) = asyncio.run(run())
    assert (admitted, computed) == (2 * (len(short) + len(long)), len(short) + len(long))
    prompts = [short, short, long, long]  # choice index = prompt index * n + sample
    for prompt, out in zip(prompts, sorted(outs, key=lambda c: c.index), strict=True):
        expected = teacher_forced(small_batch_server.model, prompt, out.token_ids)
        assert float((torch.tensor(out.logprobs) - expected).abs().max()) < 1e-5
    assert outs[0].token_ids != outs[1].token_ids, "copies of one prompt sample on their own"


def test_a_prompt_is_held_while_a_sequence_with_it_runs(small_batch_server: SimpleNamespace) -> None:
    """One request per sample (the orchestrator's way): a later request reuses the running one's prompt;
    once no sequence with it runs, the prompt is computed again."""
    prompt = [31, 32, 33, 34, 35, 36, 37]

    async def run() -> tuple[list, list[tuple[float, float]]]:  # type: ignore[type-arg]
        async with InferenceClient(small_batch_server.url) as client:
            counts = [_counts(await client.metrics())]
            first = asyncio.ensure_future(client.complete(prompt, max_tokens=200, ignore_eos=True, seed=1))
            while (await client.metrics())["num_requests_running"] < 1:
                await asyncio.sleep(0.005)
            second = await client.complete(prompt, max_tokens=3, ignore_eos=True, seed=2)
            outs = [*await first, *second]
            counts.append(_counts(await client.metrics()))
            outs += await client.complete(prompt, max_tokens=3, ignore_eos=True, seed=3)
            counts.append(_counts(await client.metrics()))
            return outs, counts

    outs, counts = asyncio.run(run())
    (a0, c0), (a1, c1), (a2, c2) = counts
    assert (a1 - a0, c1 - c0) == (2 * len(prompt), len(prompt)), "the second request reused the prompt"
    assert (a2 - a1, c2 - c1) == (len(prompt), len(prompt)), "released with its last sequence, then computed"
    for out in outs:
        expected = teacher_forced(small_batch_server.model, prompt, out.token_ids)
        assert float((torch.tensor(out.logprobs) - expected).abs().max()) < 1e-5


def test_a_held_prompt_is_computed_again_after_a_swap_point(small_batch_server: SimpleNamespace) -> None:
    """Weights change only in a call run between steps: a prompt held from before it is not reused."""
    prompt = [41, 42, 43, 44, 45, 46]

    async def run() -> float:
        async with InferenceClient(small_batch_server.url) as client:
            before = _counts(await client.metrics())[1]
            first = asyncio.ensure_future(client.complete(prompt, max_tokens=200, ignore_eos=True, seed=1))
            while (await client.metrics())["num_requests_running"] < 1:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(small_batch_server.engine.run_between_steps, lambda: None, 30)
            await client.complete(prompt, max_tokens=3, ignore_eos=True, seed=2)
            await first
            return _counts(await client.metrics())[1] - before

    assert asyncio.run(run()) == 2 * len(prompt)
