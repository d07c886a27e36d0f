"""How a multi-turn environment's conversation is compacted: the environment's side of it.

When a rollout's next prompt would pass ``context_compaction_at_tokens``, the runner asks the
policy for a summary (``request``), checks what it wrote (``summary``), and continues the rollout
from the messages ``restart`` returns. An environment with its own summary prompt or its own way
to restart overrides ``MultiTurnEnvironment.compactor`` to return a subclass of ``Compactor``.
The token side (exact ids, segments, masks) is the runner's: ``rollouts/compaction.py``.

An agent environment compacts its own conversation: ``AgentEnvironment.maybe_compact`` asks the
policy through the agent's client, and records in the rollout's ``AgentCompaction`` (set by the
runtime for each agent rollout) which captured calls were accepted or rejected summaries. Both
raise ``CompactionFailed`` when no usable summary comes, so it lives here, below both.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from telescope.core.env.types import ChatMessage, RolloutState
from telescope.core.infra import ORIGINS, InfraError

__all__ = [
    "AGENT_COMPACTION",
    "DEFAULT_SUMMARY_REQUEST",
    "AgentCompaction",
    "CompactionFailed",
    "Compactor",
    "compaction_failed",
]

DEFAULT_SUMMARY_REQUEST = (
    "Your context is almost full. Summarize the conversation so far for yourself: the task, what you "
    "have tried, what you learned and what to do next. The conversation will continue from your summary "
    "alone, so keep every fact you still need. Reply with the summary only."
)


class Compactor:
    """The default: a user message asks for the summary; the rollout restarts from the initial prompt
    (system prompt + task), the summary as a user message, and the environment's latest reply."""

    summary_request: str = DEFAULT_SUMMARY_REQUEST
    summary_heading: str = "Summary of your work so far (the earlier conversation was compacted):"

    def request(self, state: RolloutState) -> list[ChatMessage]:
        """The messages appended to the conversation to ask the policy for its summary."""
        return [{"role": "user", "content": self.summary_request}]

    def summary(self, text: str, truncated: bool, state: RolloutState) -> str | None:
        """The summary to continue from, or None when ``text`` (the policy's reply, stop text
        removed) is unusable: empty, or ``truncated`` (it ran out of tokens before it ended)."""
        text = text.strip()
        return text if text and not truncated else None

    def restart(
        self, initial: list[ChatMessage], summary: str, latest: list[ChatMessage], state: RolloutState
    ) -> list[ChatMessage]:
        """The conversation the rollout continues from: ``initial`` (the first prompt's messages),
        the summary, and ``latest`` (the environment's reply to the last turn, which the policy
        has not answered yet)."""
        return [*initial, {"role": "user", "content": f"{self.summary_heading}\n{summary}"}, *latest]


@dataclass
class AgentCompaction:
    """One agent rollout's compaction settings and record (``context_compaction_*``)."""

    at_tokens: int
    max_per_rollout: int
    attempts: int
    calls_so_far: Callable[[], int]
    """How many calls of the rollout the gateway has captured (the last one is the latest call)."""
    summaries: list[int] = field(default_factory=list)
    """Captured call index of each accepted summary (trained in a segment of its own)."""
    rejected: list[int] = field(default_factory=list)
    """Captured call index of each rejected summary attempt (trained nowhere)."""


AGENT_COMPACTION: ContextVar[AgentCompaction | None] = ContextVar("telescope_agent_compaction", default=None)
"""The running agent rollout's compaction (None: compaction is off, or no rollout runs here)."""


class CompactionFailed(InfraError):
    """The policy gave no usable summary in the attempts allowed, or there was no room to ask for one:
    the rollout cannot go on and is not the model's outcome to score (cause ``compaction_failed``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, cause="compaction_failed", provider="policy")


def compaction_failed(message: str) -> CompactionFailed:
    """A ``CompactionFailed`` to raise, counted where it happened (``infra/cause/compaction_failed``)."""
    error = CompactionFailed(message)
    ORIGINS.add(error.cause, error.provider)
    return error
