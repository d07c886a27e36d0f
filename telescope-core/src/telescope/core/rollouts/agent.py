"""One agent rollout: ``AgentEnvironment.run_agent`` against the gateway, its captured calls as the sample.

The rollout gets a capture session (a key of its own, bound to the lane's server), runs the agent
with an ``openai.AsyncOpenAI`` holding that key, closes the session (later calls are refused), and
assembles the calls by exact token prefixes (``inference.gateway.capture.assemble``): the first
segment is the sample's sequence, any further one (the agent rewrote its history) is trained beside
it with the same advantage (``RolloutSample.extra_segments``) and counted in ``agent/prefix_breaks``.
The sampling temperature and top-p of every call are the run's, whatever the agent asks, so the
trainer recomputes the logprobs the engine sampled with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.env.agent import AgentEnvironment
from telescope.core.env.compaction import AGENT_COMPACTION, AgentCompaction
from telescope.core.inference.gateway.capture import CaptureRegistry, RolloutLimits, assemble
from telescope.core.rollouts.compaction import segment_records
from telescope.core.rollouts.groups import RolloutSample

if TYPE_CHECKING:
    from telescope.core.inference.server_client import ServerClient

__all__ = ["AgentGateway", "run_agent_rollout"]


@dataclass
class AgentGateway:
    """Where a run's agents reach the model: the gateway's base URL, the model id, its capture registry."""

    url: str
    model: str
    capture: CaptureRegistry
    call_timeout_s: float = 600.0
    """HTTP timeout of one call of the agent's client."""
    site: Any = None
    """The running gateway (an ``aiohttp.web.AppRunner``) when this handle owns it."""

    async def close(self) -> None:
        """Stop the gateway this handle owns."""
        if self.site is not None:
            await self.site.cleanup()
            self.site = None


def _openai_client(gateway: AgentGateway, key: str) -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            "agent environments hand their agent an openai.AsyncOpenAI: pip install 'telescope-core[agents]'"
        ) from exc
    return openai.AsyncOpenAI(
        base_url=gateway.url, api_key=key, max_retries=0, timeout=gateway.call_timeout_s
    )


async def run_agent_rollout(
    runner: Any,
    gateway: AgentGateway,
    client: ServerClient,
    task: Any,
    on_generated: Callable[[], None],
) -> RolloutSample:
    """Run the agent of ``task`` (a ``rollout.SampleTask`` of an ``AgentEnvironment``) with ``runner`` (the
    ``rollout.RolloutRunner``, which calls this: typed loosely so the two modules do not import each
    other) and return its sample (never raises for the agent's errors: they score 0 and are counted)."""
    env = task.env
    assert isinstance(env, AgentEnvironment)
    settings = runner.settings
    forced = {"temperature": settings.temperature, "top_p": settings.top_p}
    limits = RolloutLimits(max_calls=env.max_turns, max_completion_tokens=env.max_rollout_tokens)
    session = gateway.capture.open(task.request_id, limits=limits, client=client, forced=forced)
    start_version, t0 = task.model_version(), time.time()
    compaction = settings.compaction
    plan = None
    if compaction is not None:
        plan = AgentCompaction(
            compaction.at_tokens, compaction.max_per_rollout, compaction.attempts, lambda: len(session.calls)
        )
    token = AGENT_COMPACTION.set(plan)  # AgentEnvironment.maybe_compact finds it
    try:
        async with _openai_client(gateway, session.key) as agent_client:
            result = await env.run(agent_client, gateway.model, task.sample)
    finally:
        AGENT_COMPACTION.reset(token)
        calls = gateway.capture.close(session)
    t1 = time.time()
    on_generated()
    if plan is None or compaction is None:
        segments, breaks = assemble(calls)
    else:
        summaries, rejected = frozenset(plan.summaries), frozenset(plan.rejected)
        segments, breaks = assemble(calls, summaries, rejected, compaction.train_summary)
    metrics = {"agent/calls": float(len(calls)), "agent/prefix_breaks": float(breaks)}
    if plan is not None:
        metrics["agent/compactions"] = float(len(plan.summaries))
        metrics["agent/segments_per_rollout"] = float(len(segments))
        metrics["agent/context_tokens_max"] = float(max((len(s.tokens) for s in segments), default=0))
    result.sample_metrics = {**result.sample_metrics, **metrics}
    trained: tuple[list[int], list[float], list[int], str]
    if not segments:  # the agent made no call: nothing to train
        main_prompt, trained = list(task.prompt_ids), ([], [], [], "error")
    else:
        main = segments[0]
        main_prompt = main.prompt_ids
        finish = main.turns[-1].finish_reason or "stop"
        trained = (main.completion_ids, main.logprobs, [int(m) for m in main.loss_mask], finish)
    times = (t0, t1, time.time())
    # the records keep the sequence as the model saw it (template markers and all): the dashboard's
    # conversation view splits it into the turns, tool results included
    text = runner.decode(trained[0])
    sample = runner._finish(task, *trained, result, text, start_version, times, num_turns=len(calls))
    sample.prompt_ids = list(main_prompt)
    sample.prompt_text = runner.decode(main_prompt) if segments else task.prompt_text
    sample.extra_segments = segments[1:]
    if plan is not None and plan.summaries:
        sample.info["segments"] = segment_records(
            segments, [runner.decode(s.completion_ids) for s in segments]
        )
    sample.info["agent_turns"] = [
        {
            "prompt_ids": c.prompt_ids,
            "completion_ids": c.completion_ids,
            "logprobs": c.logprobs,
            "finish_reason": c.finish_reason,
            "weight_versions": c.weight_versions,
            "text": c.text,
        }
        for c in calls
    ]
    return sample
