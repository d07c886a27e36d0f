"""How a multi-turn environment's conversation is compacted: the environment's side of it.

When a rollout's next prompt would pass ``context_compaction_at_tokens``, the runner asks the
policy for a summary (``request``), checks what it wrote (``summary``), and continues the rollout
from the messages ``restart`` returns. An environment with its own summary prompt or its own way
to restart overrides ``MultiTurnEnvironment.compactor`` to return a subclass of ``Compactor``.
The token side (exact ids, segments, masks) is the runner's: ``rollouts/compaction.py``.
"""

from __future__ import annotations

from telescope.core.env.types import ChatMessage, RolloutState

__all__ = ["DEFAULT_SUMMARY_REQUEST", "Compactor"]

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
