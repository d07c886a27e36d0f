"""Protocol conformance of the transformers server (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from telescope.core.cluster.run_secret import auth_headers
from telescope.core.inference.client import InferenceClient, InferenceServerError
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg

PROMPT = [5, 17, 42, 99, 7, 230, 11]


@pytest.fixture(scope="module")
def server(tiny_path: str) -> Iterator[SimpleNamespace]:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    srv = start_in_thread(make_cfg(), TransformersEngineKwargs(max_num_seqs=16), port=free_port())
    yield SimpleNamespace(url=srv.url, model=srv.state.engine.model, tokenizer=srv.state.tokenizer)
    srv.stop()


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _complete(url: str, prompt, **params):  # type: ignore[no-untyped-def]
    async with InferenceClient(url) as client:
        return await client.complete(prompt, **params)


def teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp[len(prompt) - 1 : -1].gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def test_n_samples_max_tokens_and_logprobs_match_teacher_forcing(server: SimpleNamespace) -> None:
    out = run(_complete(server.url, PROMPT, n=3, max_tokens=12, temperature=0.7, top_p=0.9, ignore_eos=True))
    assert [c.index for c in out] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out}) > 1  # independent samples
    for choice in out:
        assert len(choice.token_ids) == 12 and choice.finish_reason == "length"
        assert choice.prompt_token_ids == PROMPT and choice.weight_versions == [0]
        expected = teacher_forced_logprobs(server.model, PROMPT, choice.token_ids, 0.7)
        assert torch.allclose(torch.tensor(choice.logprobs), expected, atol=1e-5, rtol=0)


def test_completions_carry_the_request_id_as_response_id(server: SimpleNamespace) -> None:
    out = run(_complete(server.url, PROMPT, n=2, max_tokens=2, request_id="g3-s1-v0"))
    assert [c.response_id for c in out] == ["g3-s1-v0", "g3-s1-v0"]  # one response, one id


def test_greedy_equals_model_generate(server: SimpleNamespace) -> None:
    out = run(_complete(server.url, PROMPT, temperature=0.0, max_tokens=10, ignore_eos=True))
    reference = server.model.generate(
        torch.tensor([PROMPT]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :]
    assert out[0].token_ids == reference.tolist()


def test_stop_token_ends_the_sample_and_is_kept(server: SimpleNamespace) -> None:
    greedy = run(_complete(server.url, PROMPT, temperature=0.0, max_tokens=10, ignore_eos=True))[0].token_ids
    stop_at = next(i for i in range(1, 10) if greedy[i] not in greedy[:i])  # first occurrence of a token
    out = run(
        _complete(
            server.url,
            PROMPT,
            temperature=0.0,
            max_tokens=10,
            ignore_eos=True,
            stop_token_ids=[greedy[stop_at]],
        )
    )
    assert out[0].token_ids == greedy[: stop_at + 1] and out[0].finish_reason == "stop"


def test_text_prompt_equals_its_token_ids(server: SimpleNamespace) -> None:
    text = "reverse: hello world"
    ids = server.tokenizer(text, add_special_tokens=False)["input_ids"]
    by_text = run(_complete(server.url, text, temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    by_ids = run(_complete(server.url, ids, temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert by_text.prompt_token_ids == ids and by_text.token_ids == by_ids.token_ids


def test_concurrent_requests_are_batched(server: SimpleNamespace) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with InferenceClient(server.url) as client:
            before = await client.metrics()
            prompts = [PROMPT[: 3 + i % 4] + [i + 1] for i in range(8)]
            outs = await asyncio.gather(
                *[client.complete(p, max_tokens=16, ignore_eos=True, seed=i) for i, p in enumerate(prompts)]
            )
            return before, await client.metrics(), outs

    before, after, outs = run(go())
    generated = after["generation_tokens_total"] - before["generation_tokens_total"]
    steps = after["decode_steps_total"] - before["decode_steps_total"]
    assert generated == 8 * 16 and all(len(o[0].token_ids) == 16 for o in outs)
    assert steps < generated / 2  # one decode step advanced several sequences
    assert after["max_running"] >= 2 and after["num_requests_running"] == 0


def test_seeded_requests_repeat(server: SimpleNamespace) -> None:
    first = run(_complete(server.url, PROMPT, max_tokens=8, seed=123, ignore_eos=True))[0].token_ids
    again = run(_complete(server.url, PROMPT, max_tokens=8, seed=123, ignore_eos=True))[0].token_ids
    assert first == again


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stop": ["x"]}, "stop_token_ids"),
        ({"logprobs": 5}, "logprobs: 0"),
        ({"prompt": list(range(1, 300)) * 2}, "max_model_len is 512"),
        ({"prompt": [1, 100000]}, "outside"),
        ({"prompt": []}, "empty"),
        ({"temperature": -1}, "temperature"),
        # hostile requests, refused before they reach the generation thread (a seed >= 2^64 killed it)
        ({"seed": 2**64}, "seed"),
        ({"seed": 2**63 - 2, "n": 4}, "seed .* is too large"),
        ({"n": 10**6}, "less than or equal to 1024"),
        ({"prompt": [[5, 6]] * 1000, "n": 5}, "5000 sequences"),
        ({"prompt": "x" * (512 * 32 + 1)}, "16385 characters"),
    ],
)
def test_bad_requests_get_clear_400s(server: SimpleNamespace, params: dict, message: str) -> None:
    prompt = params.pop("prompt", PROMPT)
    with pytest.raises((InferenceServerError, ValueError), match=message):
        run(_complete(server.url, prompt, **params))


def test_the_loop_survives_hostile_requests(server: SimpleNamespace) -> None:
    for params in ({"seed": 2**64}, {"seed": 2**64 - 1}, {"n": 10**6}):
        with pytest.raises((InferenceServerError, ValueError)):
            run(_complete(server.url, PROMPT, **params))
    out = run(_complete(server.url, PROMPT, max_tokens=3, ignore_eos=True, seed=2**62))
    assert len(out[0].token_ids) == 3


def test_health_models_and_version(server: SimpleNamespace) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with InferenceClient(server.url) as client:
            return await client.health(), await client.weight_version(), await client.is_paused()

    assert run(go()) == (True, 0, False)


def test_priority_needs_the_priority_policy() -> None:
    from telescope.core.inference.protocol import CompletionRequest
    from telescope.core.inference.transformers_engine.app import BadRequest, _check_supported

    state = SimpleNamespace(options=SimpleNamespace(scheduling_policy="fcfs"))
    with pytest.raises(BadRequest, match="vllm_scheduling_policy"):
        _check_supported(state, CompletionRequest(prompt=[1], priority=3))
    _check_supported(state, CompletionRequest(prompt=[1], priority=0))


def test_generation_stops_at_max_model_len(server: SimpleNamespace) -> None:
    prompt = [5 + i % 290 for i in range(505)]  # max_model_len 512 leaves room for 7 tokens
    out = run(_complete(server.url, prompt, temperature=0.0, max_tokens=100, ignore_eos=True))[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


def test_several_token_id_prompts_in_one_request(server: SimpleNamespace) -> None:
    import aiohttp

    prompts = [PROMPT, [9, 8, 7]]

    async def go():  # type: ignore[no-untyped-def]
        body = {
            "prompt": prompts,
            "n": 2,
            "max_tokens": 4,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 0,
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + "/v1/completions", json=body, headers=auth_headers()) as r,
        ):
            return r.status, await r.json()

    status, body = run(go())
    assert status == 200
    choices = body["choices"]
    # OpenAI/vLLM layout: choice index = prompt index * n + sample index
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [PROMPT, PROMPT, [9, 8, 7], [9, 8, 7]]
    for p, prompt in enumerate(prompts):
        greedy = run(_complete(server.url, prompt, temperature=0.0, max_tokens=4, ignore_eos=True))[
            0
        ].token_ids
        assert choices[2 * p]["token_ids"] == choices[2 * p + 1]["token_ids"] == greedy
    assert body["usage"]["prompt_tokens"] == len(PROMPT) + 3 and body["usage"]["completion_tokens"] == 16


def test_the_kv_cache_goes_under_the_name_the_model_takes() -> None:
    from telescope.core.inference.transformers_engine.core import cache_kwarg

    class NewStyle:  # transformers >= 5.2x: past_key_values is deprecated, removed in 5.40
        def forward(self, input_ids=None, cache=None, use_cache=None): ...  # type: ignore[no-untyped-def]

    class OldStyle:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...  # type: ignore[no-untyped-def]

    assert cache_kwarg(NewStyle()) == "cache" and cache_kwarg(OldStyle()) == "past_key_values"
