"""The gateway against the official ``openai`` client: a real transformers-engine server behind it,
or, where the test needs the model to say something exact (tool calls), a scripted engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest
import torch

from telescope.core.inference.client import Completion, InferenceClient
from telescope.core.inference.gateway.app import Gateway, GatewaySettings
from telescope.core.inference.gateway.capture import RolloutLimits
from telescope.core.inference.gateway.serve import GatewayThread
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg

SECRET = "s3cret-for-tests"
#: ChatML that also renders the request's tools, assistant tool calls and tool results.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def served(tiny_path: str) -> Iterator[SimpleNamespace]:
    """The tiny model on a transformers-engine server, behind a gateway that needs ``SECRET``."""
    from telescope.core.inference.transformers_engine.server import start_in_thread

    cfg = make_cfg()
    server = start_in_thread(cfg, TransformersEngineKwargs(max_num_seqs=16), port=free_port())
    settings = GatewaySettings(served_model_name="tiny", max_model_len=cfg.max_model_len, max_tokens=12)
    tokenizer = server.state.tokenizer
    gateway = GatewayThread(lambda: Gateway(InferenceClient(server.url), tokenizer, settings, secret=SECRET))
    yield SimpleNamespace(
        url=gateway.url,
        gateway=gateway,
        model=server.state.engine.model,
        tokenizer=tokenizer,
        client=openai.OpenAI(base_url=gateway.url, api_key=SECRET, max_retries=0),
    )
    gateway.stop()
    server.stop()


def teacher_forced(model: Any, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """[len(completion), vocab] logprobs of each completion position under the model."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_models_lists_the_served_model(served: SimpleNamespace) -> None:
    assert [m.id for m in served.client.models.list().data] == ["tiny"]


def test_completion_top_logprobs_and_n_match_the_model(served: SimpleNamespace) -> None:
    prompt = "reverse: hello"
    out = served.client.completions.create(
        model="tiny",
        prompt=prompt,
        n=3,
        max_tokens=6,
        temperature=0.8,
        logprobs=2,
        seed=11,
        extra_body={"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    ids = served.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 18
    for choice in out.choices:
        tokens = choice.model_extra["token_ids"]
        assert choice.text == served.tokenizer.decode(tokens, skip_special_tokens=True)
        expected = teacher_forced(served.model, ids, tokens, 0.8)
        sampled = expected.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(choice.logprobs.token_logprobs), sampled, atol=1e-5)
        for position, alternatives in enumerate(choice.logprobs.top_logprobs):
            best = expected[position].topk(2)
            names = [f"token_id:{i}" for i in best.indices.tolist()]
            assert list(alternatives) == names
            assert torch.allclose(torch.tensor(list(alternatives.values())), best.values, atol=1e-5)


def test_completion_stop_string_cuts_the_text(served: SimpleNamespace) -> None:
    plain = served.client.completions.create(
        model="tiny", prompt="reverse: world", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    stop = plain.text[3:5]
    cut = served.client.completions.create(
        model="tiny",
        prompt="reverse: world",
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert cut.text == plain.text[: plain.text.find(stop)] and cut.finish_reason == "stop"


def test_streamed_completion_is_the_same_text(served: SimpleNamespace) -> None:
    args = {"model": "tiny", "prompt": ["reverse: dog", "reverse: fox"], "max_tokens": 8, "temperature": 0}
    whole = served.client.completions.create(**args)
    chunks = list(
        served.client.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    )
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == {c.index: c.text for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_is_the_template_continued_by_the_engine(served: SimpleNamespace) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "reverse: abc"}]
    out = served.client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=10, logprobs=True, top_logprobs=2
    )
    prompt = chat_prompt(served.tokenizer, messages)
    # independent expectation: greedy decoding of the rendered template by the model itself
    reference = served.model.generate(
        torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=2, pad_token_id=0
    )[0, len(prompt) :].tolist()
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == served.tokenizer.decode(reference, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens == len(reference)
    assert len(choice.logprobs.content) == len(reference)
    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    assert choice.logprobs.content[0].top_logprobs[0].logprob == choice.logprobs.content[0].logprob  # greedy


def test_streamed_chat_deltas_join_to_the_answer(served: SimpleNamespace) -> None:
    args = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "reverse: lazy"}],
        "max_tokens": 10,
        "temperature": 0,
    }
    whole = served.client.chat.completions.create(**args).choices[0]
    chunks = list(served.client.chat.completions.create(stream=True, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_async_client_and_n_choices(served: SimpleNamespace) -> None:
    import asyncio

    async def go() -> Any:
        async with openai.AsyncOpenAI(base_url=served.url, api_key=SECRET, max_retries=0) as client:
            return await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], n=4, max_tokens=6, seed=3
            )

    out = asyncio.run(go())
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in out.choices}) > 1


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"model": "gpt-4"}, openai.NotFoundError, "'gpt-4' is not served here"),
        ({"temperature": 5}, openai.BadRequestError, "temperature"),
        (
            {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
            openai.BadRequestError,
            "tool_choice 'required' is not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            openai.BadRequestError,
            "only text parts",
        ),
        ({"extra_body": {"frobnicate": 1}}, openai.BadRequestError, "frobnicate"),
        ({"messages": [{"role": "user", "content": "x " * 300}]}, openai.BadRequestError, "608 tokens"),
    ],
)
def test_bad_requests_are_answered_4xx_in_openai_shape(
    served: SimpleNamespace, kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    args = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kwargs}
    with pytest.raises(error, match=says) as info:
        served.client.chat.completions.create(**args)
    body = info.value.body  # type: ignore[attr-defined]
    assert set(body) == {"message", "type", "param", "code"}


def test_the_engines_400_reaches_the_client(served: SimpleNamespace) -> None:
    with pytest.raises(openai.BadRequestError, match=r"outside \[0, 384\)"):
        served.client.completions.create(model="tiny", prompt=[1, 100000], max_tokens=2)


def test_every_route_needs_the_secret(served: SimpleNamespace) -> None:
    for key in ("wrong", ""):
        client = openai.OpenAI(base_url=served.url, api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="run secret"):
            client.models.list()
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="tiny", prompt="a", max_tokens=1)


def test_unknown_route_is_a_404_in_openai_shape(served: SimpleNamespace) -> None:
    with pytest.raises(openai.NotFoundError, match="/v1/embeddings"):
        served.client.embeddings.create(model="tiny", input="a")


def test_rollout_keys_are_captured_and_refused_after_the_end(served: SimpleNamespace) -> None:
    capture = served.gateway.gateway.capture
    session = served.gateway.call(lambda: capture.open("r1", limits=RolloutLimits(max_calls=2)))
    client = openai.OpenAI(base_url=served.url, api_key=session.key, max_retries=0)
    messages = [{"role": "user", "content": "reverse: cat"}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    with pytest.raises(openai.PermissionDeniedError, match="made its 2 calls"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    calls = served.gateway.call(lambda: capture.close(session))
    with pytest.raises(openai.PermissionDeniedError, match="rollout r1 has ended"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    stranger = openai.OpenAI(base_url=served.url, api_key="tsk-rollout-0000", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="unknown rollout key"):
        stranger.models.list()
    assert len(calls) == 2
    assert calls[0].prompt_ids == chat_prompt(served.tokenizer, messages[:1])
    assert calls[1].prompt_ids == chat_prompt(served.tokenizer, messages)
    for call in calls:  # what the trainer will see is what was sampled
        expected = teacher_forced(served.model, call.prompt_ids, call.completion_ids, 1.0)
        sampled = expected.gather(1, torch.tensor(call.completion_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(call.logprobs), sampled, atol=1e-5)
        assert call.weight_versions == [0]


class ScriptedEngine:
    """A stand-in for the engine boundary: answers every call with the token ids of ``replies`` in
    turn (a ``ServerClient``), and keeps the prompts it was sent."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.prompts: list[list[int]] = []
        self.params: list[dict[str, Any]] = []

    async def complete(self, prompt: list[int] | str, **params: Any) -> list[Completion]:
        assert isinstance(prompt, list)
        self.prompts.append(prompt)
        self.params.append(params)
        ids = self.tokenizer(
            self.replies[(len(self.prompts) - 1) % len(self.replies)], add_special_tokens=False
        )
        tokens = ids["input_ids"]
        return [
            Completion(i, tokens, [-0.25] * len(tokens), "stop", "", prompt, [0]) for i in range(params["n"])
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
def scripted(tiny_path: str) -> Iterator[SimpleNamespace]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    engine = ScriptedEngine(
        tokenizer,
        [
            'ok <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
            '<tool_call>{"name": "neg", "arguments": {"x": 3}}</tool_call>',
            "the answer is 3",
        ],
    )
    settings = GatewaySettings(served_model_name="tiny", max_model_len=512, chat_template=TOOLS_TEMPLATE)
    gateway = GatewayThread(lambda: Gateway(engine, tokenizer, settings))  # type: ignore[arg-type]
    yield SimpleNamespace(
        engine=engine,
        tokenizer=tokenizer,
        client=openai.OpenAI(base_url=gateway.url, api_key="x", max_retries=0),
    )
    gateway.stop()


TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "neg", "parameters": {"type": "object"}}},
]


def test_tool_calls_are_parsed_into_openai_tool_calls(scripted: SimpleNamespace) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 1 and 2"}]
    out = scripted.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok"
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("neg", {"x": 3}),
    ]
    # the agent answers the calls; the next prompt renders the calls and the results
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [
        {"role": "tool", "tool_call_id": c.id, "content": f"result {i}"} for i, c in enumerate(calls)
    ]
    final = scripted.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    assert (
        final.choices[0].message.content == "the answer is 3" and final.choices[0].message.tool_calls is None
    )
    rendered = scripted.tokenizer.decode(scripted.engine.prompts[1])
    assert rendered.startswith("<|im_start|>system\ntools: add neg<|im_end|>")
    assert '<tool_call>{"arguments": {"a": 1, "b": 2}, "name": "add"}</tool_call>' in rendered
    assert "<|im_start|>tool\nresult 1<|im_end|>" in rendered


def test_tool_calls_stream_and_tool_choice_none(scripted: SimpleNamespace) -> None:
    messages = [{"role": "user", "content": "add"}]
    chunks = list(
        scripted.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True)
    )
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "add"), (1, "neg")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    scripted.engine.replies = scripted.engine.replies[:1]
    plain = scripted.client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="none"
    )
    assert plain.choices[0].message.tool_calls is None and "<tool_call>" in plain.choices[0].message.content


def test_python_call_format(tiny_path: str) -> None:
    from transformers import AutoTokenizer

    from telescope.core.inference.gateway.chat import parse_message

    message = parse_message("call add(a=1, b=2) now", ["add"], "python")
    assert message.content == "call  now"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.tool_calls] == [
        ("add", {"a": 1, "b": 2})
    ]
    assert parse_message("add(a=1)", None, "python").content == "add(a=1)"  # no tools given: text only
    assert AutoTokenizer  # the module imports the parsers only


def test_the_same_gateway_serves_a_vllm_server(tiny_path: str) -> None:
    """The gateway over ``VllmClient`` and the vLLM stand-in of test_vllm_engine (vLLM's JSON shapes)."""
    import asyncio

    from aiohttp import web
    from transformers import AutoTokenizer

    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine

    from .test_vllm_engine import FakeVllm

    bodies: list[dict[str, Any]] = []

    class RecordingFakeVllm(FakeVllm):
        async def completions(self, request: web.Request) -> web.Response:
            bodies.append(await request.json())
            return await super().completions(request)

    async def serve_fake() -> tuple[web.AppRunner, str]:
        runner = web.AppRunner(RecordingFakeVllm().app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"

    loop = asyncio.new_event_loop()
    runner, url = loop.run_until_complete(serve_fake())
    import threading

    threading.Thread(target=loop.run_forever, daemon=True).start()
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    settings = GatewaySettings(served_model_name="tiny", max_model_len=512)
    vllm = VllmEngine(make_cfg(), VllmEngineKwargs())
    gateway = GatewayThread(lambda: Gateway(vllm.client(url), tokenizer, settings, secret=SECRET))
    try:
        client = openai.OpenAI(base_url=gateway.url, api_key=SECRET, max_retries=0)
        messages = [{"role": "user", "content": "reverse: abc"}]
        out = client.chat.completions.create(model="tiny", messages=messages, n=2, max_tokens=7, stop=["zz"])
    finally:
        gateway.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    (body,) = bodies
    assert body["prompt"] == chat_prompt(tokenizer, messages)  # token ids, rendered by the gateway
    assert body["n"] == 2 and body["max_tokens"] == 7 and body["stop"] == ["zz"] and body["logprobs"] == 0
    assert body["cache_salt"].startswith("telescope-")  # VllmClient's own parameters are kept
    assert [c.message.content for c in out.choices] == [
        tokenizer.decode([10, 11]),
        tokenizer.decode([11, 11]),
    ]
    assert out.usage.completion_tokens == 4
