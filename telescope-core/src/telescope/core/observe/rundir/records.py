"""Record types the orchestrator hands to loggers, and the run-directory schema version.

Everything here is plain data (dataclasses -> JSON-ready dicts); nothing imports torch.
The JSON layout of each record is documented in ``docs/run-directory.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CANCEL_REASONS",
    "DISCARD_REASONS",
    "EVENT_PHASES",
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "RolloutRecord",
    "TimelineEvent",
    "ZERO_ADVANTAGE_KINDS",
    "eval_event",
    "zero_advantage_kind",
]

#: Version of the run-directory layout and of every record below (bump on breaking change).
SCHEMA_VERSION = 3

#: Why a finished rollout was not used for training (any other reason a plugin or a newer
#: runtime writes is counted as a discard too: ``discarded/<reason>/count``).
DISCARD_REASONS = (
    "max_async",
    "zero_advantage",
    "rollout_error",
    "prompt_too_long",
    "reward_error",
    "infra_error",
)
#: Why an in-flight rollout was stopped before it finished (counted as cancelled).
CANCEL_REASONS = ("off_policy", "eval_drain")
#: Why a ``zero_advantage`` group carries no learning signal (``RolloutRecord.zero_advantage_kind``).
ZERO_ADVANTAGE_KINDS = ("all_zero", "all_positive", "all_equal")

#: Timeline event types the orchestrator emits (plugins may add their own).
EVENT_TYPES = (
    "generation",
    "reward",
    "trainer",
    "weight_sync",
    "eval",
    "checkpoint",
    "run",
    "sandbox",
    "vllm_request",
)
EVENT_PHASES = ("start", "end", "instant")


def zero_advantage_kind(rewards: Sequence[float], tol: float = 1e-9) -> str | None:
    """Why a group of rewards carries no signal (one of ``ZERO_ADVANTAGE_KINDS``), or None.

    ``all_zero`` (every reward 0), ``all_positive`` (every reward the same value > 0) or
    ``all_equal`` (the same value otherwise, e.g. all negative). None when the rewards differ,
    and for fewer than two rewards: one sample has nothing to be equal to, and under
    ``advantage_norm: batch`` its advantage is not zero (a ``group_size: 1`` run trains on it).
    """
    if len(rewards) < 2 or max(rewards) - min(rewards) > tol:
        return None
    if abs(rewards[0]) <= tol:
        return "all_zero"
    return "all_positive" if rewards[0] > 0 else "all_equal"


_DERIVED_ROLLOUT_FIELDS = {"kept", "prompt_tokens", "completion_tokens"}
_TOKEN_VIEW_FIELDS = ("completion_token_texts", "completion_logprobs")
_EVENT_FIELDS = ("name", "step", "group_id", "sample_id", "server", "lane", "rank", "time")


def _shallow_dict(obj: Any) -> dict[str, Any]:
    """Field dict without ``asdict``'s deep copy (serialised at once; copying 1k-token lists is slow).
    A plain dataclass's ``__dict__`` holds exactly its fields, in order: copying it is ~4x cheaper than
    a ``getattr`` per field (a driver writes several events per sample)."""
    fields = obj.__dataclass_fields__
    values = getattr(obj, "__dict__", None)
    if values is not None and len(values) == len(fields):
        return dict(values)
    return {name: getattr(obj, name) for name in fields}


@dataclass
class RolloutRecord:
    """One rollout (one completion of one prompt), kept, discarded or cancelled.

    ``discard_reason`` is None for a kept rollout, one of ``DISCARD_REASONS`` for a finished
    one not trained on, or one of ``CANCEL_REASONS`` for one stopped while in flight (its
    completion may be empty).
    """

    step: int
    """Trainer step the rollout was collected for (discarded: the step being filled)."""
    group_id: int
    """Prompt group: the ``group_size`` rollouts of one prompt share it."""
    env: str
    """Environment name."""
    sample_id: int
    """Index of this rollout within its group (0 .. group_size-1)."""
    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    completion_text: str = ""
    completion_ids: list[int] = field(default_factory=list)
    """Completion token ids (all assistant turns for multi-turn)."""
    reward: float = 0.0
    """Reward used for the advantage (after any reward_min/reward_max normalisation)."""
    raw_reward: float | None = None
    """Reward as the environment returned it (None = same as ``reward``)."""
    sample_metrics: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    model_version: int = -1
    """Policy version that generated it (the version at generation start)."""
    off_policy_steps: int = 0
    """Trainer step minus model_version when it was used or dropped."""
    stop_reason: str = ""
    """Server finish reason: ``stop``, ``length``, ``abort`` ..."""
    discard_reason: str | None = None
    zero_advantage_kind: str | None = None
    """For zero_advantage discards: ``all_zero``, ``all_positive`` or ``all_equal``."""
    server: int = -1
    lane: int = -1
    timings: dict[str, float] = field(default_factory=dict)
    """The runtime's: ``generation_start``/``generation_end``/``reward_end`` (unix times) and
    ``generation_s``/``reward_s`` (seconds)."""
    prompt_idx: int = -1
    """Dataset index of the prompt (-1 = unknown)."""
    num_turns: int = 1
    time: float = field(default_factory=time.time)
    """Unix time the record was made."""
    env_stop_reason: str | None = None
    """Why the environment ended a multi-turn rollout (``max_turns_reached``, ``context_exhausted``,
    its own ``is_done`` reason ...); None for single-turn."""
    golden_answers: dict[str, str | None] = field(default_factory=dict)
    """``RewardResult.golden_answers``: the reference answer per reward component."""
    info_turns: list[dict[str, Any]] = field(default_factory=list)
    """``RewardResult.info_turns``: extra text (test output, reward error messages ...)."""
    sample_tags: dict[str, str] = field(default_factory=dict)
    """``RewardResult.sample_tags``: string tags a UI can filter on."""
    completion_token_texts: list[str] | None = None
    """The dashboard's token view: each completion token decoded on its own (a character split
    over several byte-level tokens shows as U+FFFD in each). None when the completion is longer
    than ``rollout_token_view_max_tokens`` or the view is off."""
    completion_logprobs: list[float | None] | None = None
    """Sampler (inference) logprob of each completion token, 4 decimals; None for tokens the
    model did not generate (a multi-turn rollout's environment turns). Set with
    ``completion_token_texts``. The trainer's logprobs of the same tokens are computed on the
    trainer ranks after the record is made, so the records hold no per-token mismatch."""
    segments: list[dict[str, Any]] | None = None
    """A compacted rollout's trained sequences, in order (``rollouts/compaction.py``): each with
    ``kind`` (``conversation`` or ``summary``), ``prompt_tokens``, ``completion_tokens``,
    ``trained_tokens`` and ``text`` (its completion decoded). None: one sequence, the record's own."""

    @property
    def kept(self) -> bool:
        """True when the rollout went into a training batch."""
        return self.discard_reason is None

    @property
    def cancelled(self) -> bool:
        """True when the rollout was stopped in flight."""
        return self.discard_reason in CANCEL_REASONS

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutRecord:
        """Rebuild a record from ``to_dict`` output (derived fields are ignored)."""
        names = set(cls.__dataclass_fields__)
        unknown = set(data) - names - _DERIVED_ROLLOUT_FIELDS
        if unknown:
            raise ValueError(
                f"rollout row has unknown fields {sorted(unknown)}: valid fields are {sorted(names)}"
            )
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the derived ``kept``/token-count fields added (the token view's
        fields and ``segments`` only when set: most records do without them)."""
        out = _shallow_dict(self)
        for name in (*_TOKEN_VIEW_FIELDS, "segments"):
            if out[name] is None:
                del out[name]
        out["kept"] = self.kept
        out["prompt_tokens"] = self.prompt_tokens
        out["completion_tokens"] = self.completion_tokens
        return out


@dataclass
class TimelineEvent:
    """One point on the run timeline (a span is a ``start`` and an ``end`` with equal fields).

    ``type`` is one of ``EVENT_TYPES`` for core events; ``name`` refines it (a trainer phase
    such as ``forward``, an eval name, ...). Unused ids stay None.
    """

    type: str
    phase: str = "instant"
    name: str = ""
    step: int | None = None
    group_id: int | None = None
    sample_id: int | None = None
    server: int | None = None
    lane: int | None = None
    rank: int | None = None
    time: float = field(default_factory=time.time)
    """Unix time of the event."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """Anything else (duration, byte counts, eval scores ...)."""

    def __post_init__(self) -> None:
        if self.phase not in EVENT_PHASES:
            raise ValueError(
                f"TimelineEvent phase {self.phase!r} is not valid: use one of {', '.join(EVENT_PHASES)}"
            )

    @classmethod
    def of(cls, type: str, phase: str = "instant", **fields: Any) -> TimelineEvent:
        """An event from loose fields: the named ids as they are, anything else into ``attrs``."""
        known = {k: fields.pop(k) for k in _EVENT_FIELDS if k in fields}
        attrs = dict(fields.pop("attrs", None) or {})
        return cls(type=type, phase=phase, **known, attrs={**fields, **attrs})

    def to_dict(self) -> dict[str, Any]:
        return _shallow_dict(self)


def eval_event(step: int, name: str, metrics: dict[str, float], samples: int) -> TimelineEvent:
    """The ``eval`` instant of one eval result: ``attrs = {"scores": metrics, "samples": samples}``."""
    return TimelineEvent(
        "eval", name=str(name), step=int(step), attrs={"scores": dict(metrics), "samples": samples}
    )
