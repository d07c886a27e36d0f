"""Rollout groups: reward normalisation, advantages, zero-advantage filtering, discard reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from telescope.core.observe.rundir.records import zero_advantage_kind  # the run directory's vocabulary

__all__ = [
    "GroupFailure",
    "RolloutGroup",
    "RolloutSample",
    "normalize_reward",
    "reward_failed",
    "zero_advantage_kind",
]


@dataclass(frozen=True)
class GroupFailure:
    """Why a group could not be trained on: a discard ``reason`` and the detail a user needs."""

    reason: str
    """``rollout_error``, ``prompt_too_long``, ``reward_error`` or ``infra_error`` (a discard reason
    of the records)."""
    message: str

    @classmethod
    def masked(cls, env: str, left: int, detail: str) -> GroupFailure:
        """Infrastructure failures masked samples until fewer than 2 were left (no advantage to compute)."""
        return cls(
            "infra_error", f"{left} sample(s) left after masking infrastructure failures in '{env}': {detail}"
        )

    @classmethod
    def rewards_failed(cls, env: str, sample: RolloutSample) -> GroupFailure:
        """Every reward of the group raised or timed out; ``sample`` is the first of them."""
        detail = next(iter(sample.info.get("reward_errors") or []), "")
        suffix = f": {detail}" if detail else ""
        return cls("reward_error", f"every reward of the group failed in environment '{env}'{suffix}")


@dataclass
class RolloutSample:
    """One finished rollout of a group, as scored."""

    prompt_ids: list[int]
    completion_ids: list[int]
    inference_logprobs: list[float]
    loss_mask: list[int] | None
    finish_reason: str
    reward: float
    raw_reward: float
    sample_metrics: dict[str, float] = field(default_factory=dict)
    prompt_text: str = ""
    completion_text: str = ""
    server: int = -1
    lane: int = -1
    model_version_start: int = -1
    model_version_end: int = -1
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    advantage: float = 0.0
    num_turns: int = 1
    response_ids: list[str] = field(default_factory=list)
    """The server's response id of each turn (vLLM trace spans are found by it)."""
    completion_token_texts: list[str] | None = None
    """Each completion token decoded on its own, for the records' token view (None: not kept,
    see ``rollout_token_view_max_tokens``)."""
    extra_segments: list[Any] = field(default_factory=list)
    """Further sequences of the same rollout (``inference.gateway.capture.Segment``: an agent that
    rewrote its history), trained beside this one with the same advantage."""
    teacher_logprobs: list[list[float]] | None = None
    """On-policy distillation: the teacher's logprob of each completion token, for this sequence and
    then each of ``extra_segments`` (``rollouts.distill``); None without a teacher."""


@dataclass
class RolloutGroup:
    """All ``group_size`` rollouts of one prompt."""

    group_id: int
    env_name: str
    sample_idx: int
    samples: list[RolloutSample]
    model_version: int = -1
    discard_reason: str | None = None
    zero_advantage_kind: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        """The (normalised) rewards, in sample order."""
        return [s.reward for s in self.samples]

    @property
    def oldest_version(self) -> int:
        """The oldest policy version any of its samples started generating with (-1: no samples)."""
        return min((s.model_version_start for s in self.samples), default=-1)


def reward_failed(sample: RolloutSample) -> bool:
    """The reward of ``sample`` raised or timed out (``Environment.score`` / ``Rubric`` count these)."""
    metrics = sample.sample_metrics
    return metrics.get("reward_error", 0.0) > 0 or metrics.get("reward_timeout", 0.0) > 0


def normalize_reward(reward: float, reward_min: float | None, reward_max: float | None) -> float:
    """Map [reward_min, reward_max] onto [0, 1] when both bounds are declared, else unchanged.

    Values outside the declared range map outside [0, 1] rather than being clipped, so a
    mis-declared range shows up in the reward charts instead of being hidden.
    """
    if reward_min is None or reward_max is None:
        return reward
    return (reward - reward_min) / (reward_max - reward_min)
