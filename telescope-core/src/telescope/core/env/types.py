"""Data types exchanged between environments, the orchestrator and loggers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChatMessage",
    "CompletionNotes",
    "EvalMetricsResult",
    "Messages",
    "RewardResult",
    "RolloutState",
    "Sample",
    "TrajectoryStep",
    "info_turn",
]

ChatMessage = dict[str, Any]
Messages = str | list[ChatMessage]


@dataclass
class Sample:
    """One prompt of an environment's dataset.

    ``prompt`` is the question text (single-turn) or a message list; ``answer`` the reference
    answer as text; ``metadata`` anything the reward needs (numbers, tests, tags).
    """

    prompt: Messages
    answer: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


def info_turn(
    key: str, value: str, *, order: int = 0, kind: str = "text", limit: int = 4000
) -> dict[str, Any]:
    """One ``info_turns`` record (text shown next to a rollout), truncated to ``limit`` chars."""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} chars truncated]"
    return {"turn_order": order, "info_key": key, "info_value": text, "info_type": kind}


@dataclass(kw_only=True)
class CompletionNotes:
    """What scoring records about one completion beside its numbers (keyword-only fields).

    ``golden_answers`` the reference answer per component; ``info_turns`` extra text (errors,
    test output); ``sample_tags`` string tags a UI can filter on.
    """

    golden_answers: dict[str, str | None] = field(default_factory=dict)
    info_turns: list[dict[str, Any]] = field(default_factory=list)
    sample_tags: dict[str, str] = field(default_factory=dict)


@dataclass
class RewardResult(CompletionNotes):
    """What scoring one completion (or one multi-turn rollout) produced.

    ``sample_metrics`` holds reward components and any per-sample numbers; the notes
    (``golden_answers``, ``info_turns``, ``sample_tags``) are ``CompletionNotes``'.
    """

    total_reward: float
    sample_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EvalMetricsResult(CompletionNotes):
    """What an eval records per completion; ``metrics`` feed averages and pass@k."""

    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TrajectoryStep:
    """One model call of a rollout: the messages it saw, what it wrote, and its tokens."""

    prompt: Messages
    completion: Messages
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    is_truncated: bool = False

    @property
    def completion_text(self) -> str:
        """The assistant text of this step."""
        if isinstance(self.completion, str):
            return self.completion
        return "".join(str(m.get("content", "")) for m in self.completion)


@dataclass
class RolloutState:
    """Everything one (multi-turn) rollout accumulates; ``custom`` is the environment's own."""

    sample: Sample
    env_name: str = ""
    trajectory: list[TrajectoryStep] = field(default_factory=list)
    is_completed: bool = False
    stop_reason: str | None = None
    error: str | None = None
    custom: dict[str, Any] = field(default_factory=dict)
    summaries: list[str] = field(default_factory=list)
    """The summaries the rollout continued from, in order (context compaction)."""

    @property
    def num_turns(self) -> int:
        """Number of model calls so far."""
        return len(self.trajectory)

    def get_full_completion_ids(self) -> list[int]:
        """Completion token ids of every turn, concatenated."""
        return [t for step in self.trajectory for t in step.completion_token_ids]

    def get_full_logprobs(self) -> list[float]:
        """Completion logprobs of every turn, concatenated."""
        return [lp for step in self.trajectory for lp in step.completion_logprobs]

    def last_messages(self) -> list[ChatMessage]:
        """The whole conversation as of the last turn (its prompt plus its completion)."""
        if not self.trajectory:
            return []
        last = self.trajectory[-1]
        prompt = last.prompt if isinstance(last.prompt, list) else [{"role": "user", "content": last.prompt}]
        completion = (
            last.completion
            if isinstance(last.completion, list)
            else [{"role": "assistant", "content": last.completion}]
        )
        return [*prompt, *completion]

    def assistant_texts(self) -> list[str]:
        """The assistant text of every turn, in order."""
        return [step.completion_text for step in self.trajectory]
