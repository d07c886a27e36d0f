"""Agent rollouts: ``AgentEnvironment.run_agent`` with a real ``openai.AsyncOpenAI`` against the gateway in
front of a real transformers-engine server; the captured calls become the sample (rollouts/agent.py).
Context compaction (``AgentEnvironment.maybe_compact``): the summary call is a segment of its own with
its sampled ids, rejected attempts are trained nowhere, every other call trains once; a summary that
never comes is an infrastructure failure, never a 0."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest
import torch

from telescope.core.env import AgentEnvironment, AgentKwargs, RewardResult, Sample
from telescope.core.env.compaction import Compactor
from telescope.core.env.types import RolloutState
from telescope.core.inference.client import InferenceClient
from telescope.core.inference.gateway.app import Gateway, GatewaySettings
from telescope.core.inference.gateway.serve import start_gateway
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.infra import infra_cause
from telescope.core.rollouts.agent import AgentGateway
from telescope.core.rollouts.compaction import CompactionSettings
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask
from telescope.core.weights.group import free_port

from .conftest import make_cfg


@pytest.fixture(scope="module")
def server(tiny_path: str) -> Iterator[Any]:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    srv = start_in_thread(make_cfg(), TransformersEngineKwargs(max_num_seqs=8), port=free_port())
    yield srv
    srv.stop()


class ScriptedAgent(AgentEnvironment):
    """Test agent: ``behaviour`` is the coroutine run as ``run_agent``."""

    def __init__(self, behaviour: Any, **kwargs: Any) -> None:
        super().__init__(AgentKwargs(**kwargs))
        self.behaviour = behaviour

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample(prompt="reverse: abc", answer="cba")]

    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        return await self.behaviour(client, model, sample)


def rollout(
    server: Any, env: AgentEnvironment, temperature: float = 1.0, compaction: Any = None
) -> tuple[Any, Any]:
    """One rollout of ``env``'s first sample; returns (sample, the gateway's capture registry).
    ``compaction``: the run's ``rollouts.compaction.CompactionSettings`` (None: off)."""

    async def go() -> tuple[Any, Any]:
        tokenizer = server.state.tokenizer
        async with InferenceClient(server.url) as engine:
            gateway = Gateway(engine, tokenizer, GatewaySettings(served_model_name="tiny", max_model_len=512))
            runner_site, url = await start_gateway(gateway)
            try:
                settings = GenerationSettings(temperature, None, 8, 512, [2], False, 0, compaction)
                runner = RolloutRunner(tokenizer, settings, None)
                runner.agent_gateway = AgentGateway(url, "tiny", gateway.capture)
                task = SampleTask("r0", env, env.get_sample(0), [1, 2], "reverse: abc", None, None)
                return await runner.run(engine, task, lambda: None), gateway.capture
            finally:
                await runner_site.cleanup()

    return asyncio.run(go())


def sampled_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def test_token_level_turns_join_one_sequence_with_tool_tokens_masked(server: Any) -> None:
    tool_ids = [40, 41, 42]  # the "tool result", rendered by the agent as token ids

    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        prompt = [5, 17, 42]
        for _ in range(3):
            out = await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=4,
                temperature=0.3,
                extra_body={"return_token_ids": True},
            )
            prompt = prompt + out.choices[0].model_extra["token_ids"] + tool_ids
        return RewardResult(0.75)

    sample, _ = rollout(server, ScriptedAgent(agent), temperature=0.7)
    turns = sample.info["agent_turns"]
    assert sample.num_turns == 3 and sample.raw_reward == 0.75
    assert sample.sample_metrics["agent/prefix_breaks"] == 0 and sample.extra_segments == []
    assert sample.prompt_ids == [5, 17, 42]
    expected_ids, expected_mask = [], []
    for i, turn in enumerate(turns):
        expected_ids += turn["completion_ids"] + (tool_ids if i < 2 else [])
        expected_mask += [1] * len(turn["completion_ids"]) + ([0] * 3 if i < 2 else [])
    assert sample.completion_ids == expected_ids and sample.loss_mask == expected_mask
    # the run's temperature (0.7), not the agent's (0.3): the logprobs are the trainer's
    model = server.state.engine.model
    reference = sampled_logprobs(model, sample.prompt_ids, sample.completion_ids, 0.7)
    trained = torch.tensor(sample.loss_mask, dtype=torch.bool)
    assert torch.allclose(torch.tensor(sample.inference_logprobs)[trained], reference[trained], atol=1e-5)


def test_a_chat_agent_with_tool_results_trains_one_sequence_of_its_sampled_ids(server: Any) -> None:
    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": sample.prompt}]
        for i in range(2):
            reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=5)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
        final = await client.chat.completions.create(model=model, messages=messages, max_tokens=5)
        return RewardResult(float(final.choices[0].message.content == sample.answer))

    sample, _ = rollout(server, ScriptedAgent(agent))
    turns = sample.info["agent_turns"]
    assert sample.num_turns == 3 and sample.sample_metrics["agent/calls"] == 3
    tokenizer = server.state.tokenizer
    first = tokenizer.apply_chat_template(
        [{"role": "user", "content": "reverse: abc"}], tokenize=False, add_generation_prompt=True
    )
    assert turns[0]["prompt_ids"] == tokenizer(first, add_special_tokens=False)["input_ids"]
    # the agent sent back text; the gateway put the sampled ids back: one sequence, nothing broken
    assert sample.sample_metrics["agent/prefix_breaks"] == 0 and sample.extra_segments == []
    sequence = sample.prompt_ids + sample.completion_ids
    for turn in turns:
        assert sequence[: len(turn["prompt_ids"])] == turn["prompt_ids"]
    glue = tokenizer.decode(
        [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if not m]
    )
    assert glue.count("<|im_start|>tool\nok<|im_end|>") == 2  # the tool results, masked out of the loss
    assert sum(sample.loss_mask) == sum(len(t["completion_ids"]) for t in turns)
    from telescope.cli.ui.conversation import split_messages

    roles = [m["role"] for m in split_messages(sample.completion_text, "assistant")]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]  # every turn in the view
    for turn in turns:
        reference = sampled_logprobs(
            server.state.engine.model, turn["prompt_ids"], turn["completion_ids"], 1.0
        )
        assert torch.allclose(torch.tensor(turn["logprobs"]), reference, atol=1e-5)


def test_a_rewritten_history_is_a_second_segment_and_counted(server: Any) -> None:
    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        await client.completions.create(model=model, prompt=[5, 17, 42], max_tokens=4)
        await client.completions.create(model=model, prompt=[5, 99, 7], max_tokens=4)  # "summarised"
        return RewardResult(1.0)

    sample, _ = rollout(server, ScriptedAgent(agent))
    assert sample.sample_metrics["agent/prefix_breaks"] == 1
    (extra,) = sample.extra_segments
    assert sample.prompt_ids == [5, 17, 42] and extra.prompt_ids == [5, 99, 7]
    assert extra.completion_ids == sample.info["agent_turns"][1]["completion_ids"]

    from telescope.core.algorithms import get_algorithm
    from telescope.core.plugins import load_plugins
    from telescope.core.rollouts.batching import BatchBuilder
    from telescope.core.rollouts.groups import RolloutGroup

    cfg = make_cfg(seq_len=64, pad_to_multiple_of=1)
    _, registry = load_plugins()
    batch = BatchBuilder(cfg, get_algorithm(cfg.algorithm, registry), 0).build(
        [RolloutGroup(0, "agent", 0, [sample])], 1, 0
    )
    assert batch.metrics["batch/num_samples"] == 1.0
    rows = batch.per_rank[0]
    trained = sum(sum(mb.loss_mask) for mb in rows.micro_batches)
    assert trained == len(sample.completion_ids) + len(extra.completion_ids)  # both segments trained


def test_an_agent_that_raises_scores_zero_and_late_calls_are_refused(server: Any) -> None:
    kept: dict[str, Any] = {}

    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        kept["client"] = client
        await client.completions.create(model=model, prompt=[5, 17], max_tokens=3)
        raise ValueError("the agent's own bug")

    sample, _ = rollout(server, ScriptedAgent(agent))
    assert sample.raw_reward == 0.0 and sample.sample_metrics["agent_error"] == 1.0
    assert "ValueError: the agent's own bug" in sample.info["info_turns"][0]["info_value"]
    assert sample.num_turns == 1 and len(sample.completion_ids) > 0  # what it sampled is still a sample


def test_max_turns_is_enforced_by_the_gateway(server: Any) -> None:
    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        refused = 0
        for _ in range(5):
            try:
                await client.completions.create(model=model, prompt=[5, 17], max_tokens=2)
            except openai.PermissionDeniedError as exc:
                assert "made its 2 calls" in str(exc)
                refused += 1
        return RewardResult(float(refused))

    sample, capture = rollout(server, ScriptedAgent(agent, max_turns=2))
    assert sample.num_turns == 2 and sample.raw_reward == 3.0 and len(capture) == 0


def test_calls_after_the_rollout_ended_are_refused(server: Any) -> None:
    kept: dict[str, Any] = {}

    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        kept["key"] = client.api_key
        return RewardResult(1.0)

    _, capture = rollout(server, ScriptedAgent(agent))
    from telescope.core.inference.gateway.errors import GatewayError

    with pytest.raises(GatewayError, match="rollout r0 has ended"):
        capture.lookup(kept["key"])
    assert SimpleNamespace


def test_the_agent_in_docs_agents_md_runs(server: Any) -> None:
    """The complete agent of docs/agents.md, as written there, runs a rollout."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    (code,) = [
        block for block in re.findall(r"```python\n(.*?)```", doc, re.DOTALL) if "AgentEnvironment" in block
    ]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/agents.md", "exec"), namespace)
    sample, _ = rollout(server, namespace["Adder"]())
    assert 1 <= sample.num_turns <= 3 and sample.sample_metrics["agent/calls"] == sample.num_turns
    assert "agent_error" not in sample.sample_metrics, sample.info["info_turns"]
    assert sample.raw_reward in (0.0, 1.0) and len(sample.completion_ids) > 0


# --- context compaction: AgentEnvironment.maybe_compact ------------------------------------------
SETTINGS = CompactionSettings(at_tokens=40, max_per_rollout=2, train_summary=True, attempts=2)


class Picky(Compactor):
    """Accepts whatever the tiny model writes, except the attempts listed in ``refuse`` (0-based)."""

    summary_request = "Sum up."

    def __init__(self, refuse: set[int]) -> None:
        self.refuse, self.seen = refuse, 0

    def summary(self, text: str, truncated: bool, state: RolloutState) -> str | None:
        self.seen += 1
        return None if self.seen - 1 in self.refuse else text


class Compacting(ScriptedAgent):
    def __init__(self, behaviour: Any, compactor: Compactor) -> None:
        super().__init__(behaviour)
        self._compactor = compactor

    def compactor(self) -> Compactor:
        return self._compactor


def chatty(env: list[Any]) -> Any:
    """Four turns; after each, the conversation is compacted once it passed the threshold."""

    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(sample.prompt)}]
        for _ in range(4):
            reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "and again"},
            ]
            messages = await env[0].maybe_compact(client, model, messages, reply.usage.total_tokens, 8)
        return RewardResult(1.0)

    return agent


def run(server: Any, refuse: set[int], settings: CompactionSettings = SETTINGS) -> tuple[Any, Compacting]:
    holder: list[Any] = []
    env = Compacting(chatty(holder), Picky(refuse))
    holder.append(env)
    sample, _ = rollout(server, env, compaction=settings)
    return sample, env


def test_the_summary_is_its_own_segment_and_a_rejected_attempt_is_trained_nowhere(server: Any) -> None:
    sample, _ = run(server, refuse={0})  # the first summary attempt is refused, then retried
    turns = sample.info["agent_turns"]
    segments = [sample, *sample.extra_segments]
    kinds = [getattr(s, "summary", False) for s in segments]
    assert sample.sample_metrics["agent/compactions"] == 2.0 == sum(kinds)
    assert kinds == [False, True, False, True, False]
    assert sample.sample_metrics["agent/segments_per_rollout"] == 5.0
    completions = [t["completion_ids"] for t in turns]
    decode = server.state.tokenizer.decode
    asked = [i for i, t in enumerate(turns) if "Sum up." in decode(t["prompt_ids"])]  # summary calls
    assert len(asked) == 3 and len(turns) == 7  # 4 turns; 2 compactions, the first asked twice
    refused = asked[0]
    in_segments = [t.completion_ids for s in sample.extra_segments for t in s.turns]
    for seg in sample.extra_segments:
        if seg.summary:
            assert len(seg.turns) == 1 and seg.completion_ids == seg.turns[0].completion_ids
            assert seg.loss_mask == [True] * len(seg.completion_ids)
    assert [seg.turns[0].completion_ids for seg in sample.extra_segments if seg.summary] == [
        completions[i] for i in asked[1:]
    ]
    assert completions[refused] not in in_segments
    trained = sum(sample.loss_mask or []) + sum(sum(s.loss_mask) for s in sample.extra_segments)
    assert trained == sum(len(c) for c in completions) - len(completions[refused])  # all but the refused
    records = sample.info["segments"]
    assert [r["kind"] for r in records] == [
        "conversation",
        "summary",
        "conversation",
        "summary",
        "conversation",
    ]


def test_an_untrained_summary_is_masked(server: Any) -> None:
    settings = CompactionSettings(at_tokens=40, max_per_rollout=1, train_summary=False, attempts=1)
    sample, _ = run(server, refuse=set(), settings=settings)
    (summary,) = [s for s in sample.extra_segments if s.summary]
    assert summary.completion_ids and not any(summary.loss_mask)


def test_no_usable_summary_is_an_infrastructure_failure(server: Any) -> None:
    with pytest.raises(Exception, match="no usable summary in 2 attempts") as failed:
        run(server, refuse={0, 1})
    cause = infra_cause(failed.value)
    assert cause is not None and cause.cause == "compaction_failed"


def failed_rollout(
    server: Any, agent: Any, engine_url: str | None = None, gateway_url: str | None = None
) -> Any:
    """The exception one rollout of ``agent`` raised, with the infrastructure failures counted meanwhile;
    ``engine_url``: the engine behind the gateway (default: the test server), ``gateway_url``: where the
    agent is told the gateway is (default: where it is)."""
    from telescope.core.infra import ORIGINS

    env = ScriptedAgent(agent)

    async def go() -> BaseException:
        tokenizer = server.state.tokenizer
        async with InferenceClient(engine_url or server.url) as engine:
            gateway = Gateway(engine, tokenizer, GatewaySettings(served_model_name="tiny", max_model_len=512))
            runner_site, url = await start_gateway(gateway)
            try:
                settings = GenerationSettings(1.0, None, 8, 512, [2], False, 0, None)
                runner = RolloutRunner(tokenizer, settings, None)
                runner.agent_gateway = AgentGateway(
                    gateway_url or url, "tiny", gateway.capture, call_timeout_s=20
                )
                task = SampleTask("r0", env, env.get_sample(0), [1, 2], "reverse: abc", None, None)
                with pytest.raises(Exception) as failed:
                    await runner.run(engine, task, lambda: None)
                return failed.value
            finally:
                await runner_site.cleanup()

    ORIGINS.drain()
    error = asyncio.run(go())
    return error, {(o.cause, o.provider): n for o, n in ORIGINS.drain().items()}


async def one_call(client: Any, model: str, sample: Sample) -> RewardResult:
    await client.completions.create(model=model, prompt=[5, 17], max_tokens=3)
    return RewardResult(1.0)


def test_an_engine_failure_behind_the_gateway_is_the_infrastructures_counted_once(server: Any) -> None:
    """The engine behind the gateway is gone: the gateway answers 502 naming the failure it counted
    (server_died), and the agent's InternalServerError becomes that infrastructure failure, not a 0
    (counted where it happened, not again on the agent's side)."""
    dead = f"http://127.0.0.1:{free_port()}"
    error, counted = failed_rollout(server, one_call, engine_url=dead)
    assert isinstance(error, openai.InternalServerError) and error.status_code == 502
    cause = infra_cause(error)
    assert cause is not None and (cause.cause, cause.provider) == ("server_died", "inference")
    assert counted == {("server_died", "inference"): 1}


def test_an_unreachable_gateway_is_a_gateway_transport_failure(server: Any) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    error, counted = failed_rollout(server, one_call, gateway_url=nowhere)
    assert isinstance(error, openai.APIConnectionError)
    cause = infra_cause(error)
    assert cause is not None and (cause.cause, cause.provider) == ("gateway_transport", "gateway")
    assert counted == {("gateway_transport", "gateway"): 1}


def test_the_agents_own_service_failing_stays_the_agents(server: Any) -> None:
    """A connection refused by a service of the agent's own (not the gateway) scores 0 (agent_error)."""
    nowhere = f"http://127.0.0.1:{free_port()}/v1"

    async def agent(client: Any, model: str, sample: Sample) -> RewardResult:
        await client.completions.create(model=model, prompt=[5, 17], max_tokens=3)
        async with openai.AsyncOpenAI(base_url=nowhere, api_key="x", max_retries=0) as own:
            await own.models.list()
        return RewardResult(1.0)

    sample, _ = rollout(server, ScriptedAgent(agent))
    assert sample.raw_reward == 0.0 and sample.sample_metrics["agent_error"] == 1.0
    assert "APIConnectionError" in sample.info["info_turns"][0]["info_value"]
