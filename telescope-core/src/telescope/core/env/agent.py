"""``AgentEnvironment``: an agent written against the OpenAI API, trained on what it sampled.

The user implements ``load_dataset`` and ``run_agent(client, model, sample) -> RewardResult``;
``client`` is an ``openai.AsyncOpenAI`` bound to the run's gateway with a key of this rollout only,
so every call the agent makes (any number, tools run by the agent's own code in between) is
captured in token ids and logprobs and becomes the sample's trajectory. The agent's own reward is
returned by ``run_agent``. An agent that raises or runs past ``agent_timeout_s`` scores 0 and is
counted (``agent_error`` / ``agent_timeout``), never crashing the run; a call to the gateway that failed
for a transport reason (refused, reset, a 5xx, a timeout: ``infra.gateway_call_failure``) is the
infrastructure's, retried or masked like any other, never a 0; calls past ``max_turns`` or
``max_rollout_tokens`` are refused by the gateway (HTTP 403, ``openai.PermissionDeniedError``).

A complete agent::

    class Adder(AgentEnvironment):
        def load_dataset(self, num_samples=-1):
            return [Sample(prompt=f"{a} + {b}", answer=str(a + b)) for a in range(9) for b in range(9)]

        async def run_agent(self, client, model, sample):
            messages = [{"role": "user", "content": sample.prompt}]
            reply = await client.chat.completions.create(model=model, messages=messages)
            text = reply.choices[0].message.content or ""
            return RewardResult(float(text.strip() == sample.answer))
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import Any, ClassVar

from pydantic import Field

from telescope.core.env import reward_log
from telescope.core.env.base import ConversationEnvironment, EnvironmentKwargs, _failed_reward
from telescope.core.env.compaction import AGENT_COMPACTION, compaction_failed
from telescope.core.env.types import ChatMessage, RewardResult, RolloutState, Sample
from telescope.core.infra import gateway_call_failure, infra_cause

__all__ = ["AgentEnvironment", "AgentKwargs", "agent_failed"]


class AgentKwargs(EnvironmentKwargs):
    """Kwargs of agent environments."""

    max_turns: int = Field(default=10, ge=1)
    """Most model calls one rollout may make through the gateway (the next is refused)."""
    max_rollout_tokens: int | None = Field(default=None, ge=1)
    """Most completion tokens over a rollout's calls (null: only max_tokens per call and the context)."""
    agent_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds one ``run_agent`` may take; past it the rollout scores 0 (agent_timeout)."""


def agent_failed(key: str, message: str) -> RewardResult:
    """The reward of a rollout whose agent raised (``agent_error``) or timed out (``agent_timeout``)."""
    return _failed_reward(key, message, ("agent_error", "agent_timeout"))


class AgentEnvironment(ConversationEnvironment):
    """An environment whose rollouts are agents calling the model through the OpenAI API."""

    kwargs_model: ClassVar[type[EnvironmentKwargs]] = AgentKwargs
    is_agent: ClassVar[bool] = True

    @property
    def max_rollout_tokens(self) -> int | None:
        """Completion-token budget of one rollout (None: none)."""
        return getattr(self.kwargs, "max_rollout_tokens", None)

    @abstractmethod
    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        """Run the agent on ``sample`` with ``client`` (``openai.AsyncOpenAI``) and ``model`` (the id to
        pass as ``model=``); return its reward."""

    async def run(self, client: Any, model: str, sample: Sample) -> RewardResult:
        """``run_agent`` under ``agent_timeout_s``; never raises (a failure scores 0 and is counted)."""
        timeout = float(getattr(self.kwargs, "agent_timeout_s", 600.0))
        token = reward_log.scoring(self)
        try:
            return await asyncio.wait_for(self.run_agent(client, model, sample), timeout=timeout)
        except TimeoutError:
            message = f"run_agent took longer than {timeout}s (agent_timeout_s)"
            reward_log.report("run_agent", None, message)
            return agent_failed("agent_timeout", message)
        except Exception as exc:  # an agent never crashes the run, but is logged and counted
            if infra_cause(exc) is not None:  # the infrastructure's (a compaction that failed ...): retried
                raise
            if gateway_call_failure(exc, str(getattr(client, "base_url", ""))) is not None:
                raise  # a call to the gateway failed for a transport reason (refused, reset, 5xx, timeout)
            reward_log.report("run_agent", exc)
            return agent_failed("agent_error", f"{type(exc).__name__}: {exc}")
        finally:
            reward_log.reset(token)

    async def maybe_compact(
        self,
        client: Any,
        model: str,
        messages: list[ChatMessage],
        context_tokens: int,
        max_tokens: int | None = None,
    ) -> list[ChatMessage]:
        """The conversation to go on with: ``messages`` while ``context_tokens`` (the last reply's
        ``usage.total_tokens``) is within ``context_compaction_at_tokens`` (or compaction is off, or
        used up); past it, the policy's summary of ``messages`` (asked through ``client``, so it is
        captured and trained in a segment of its own) after the messages before the first assistant
        reply (system prompt + task), then what followed the last assistant reply. Call it between two
        calls of the agent, not while another is running (the summary call is the latest captured).
        ``max_tokens``: the summary's budget (None: the gateway's)."""
        plan = AGENT_COMPACTION.get()
        if plan is None or context_tokens <= plan.at_tokens or len(plan.summaries) >= plan.max_per_rollout:
            return messages
        compactor = self.compactor()
        state = RolloutState(sample=Sample(prompt=list(messages)), env_name=self.name)
        roles = [m.get("role") for m in messages]
        first = roles.index("assistant") if "assistant" in roles else len(messages)
        last = len(roles) - roles[::-1].index("assistant") if "assistant" in roles else len(messages)
        request = [*messages, *compactor.request(state)]
        for _ in range(plan.attempts):
            reply = await client.chat.completions.create(model=model, messages=request, max_tokens=max_tokens)
            choice = reply.choices[0]
            index = plan.calls_so_far() - 1
            text = choice.message.content or ""
            summary = compactor.summary(text, choice.finish_reason == "length", state)
            if summary is not None:
                plan.summaries.append(index)
                return compactor.restart(messages[:first], summary, messages[last:], state)
            plan.rejected.append(index)
        raise compaction_failed(
            f"agent {self.name}: no usable summary in {plan.attempts} attempts (the last: {len(text)} "
            f"characters, finish reason {choice.finish_reason!r}); raise max_tokens or "
            "context_compaction_attempts, or give the environment a compactor it can satisfy"
        )

    async def compute_reward(self, *args: Any, **kwargs: Any) -> RewardResult:
        """Agents score themselves in ``run_agent``; there is no separate reward call."""
        raise TypeError(f"{type(self).__name__} is an agent environment: its reward comes from run_agent")
