"""Capture: the calls a rollout makes through the gateway, in token ids, and its trajectory.

The runtime opens a ``CaptureSession`` per agent rollout; its ``key`` is the API key the rollout's
``openai.AsyncOpenAI`` sends. Every call made with the key is recorded exactly as sampled (prompt
ids, completion ids, logprobs, finish reason, weight versions). When the rollout ends the session is
closed: later calls with its key are refused (403), and unknown keys are refused (401).

``assemble`` turns a rollout's calls into training segments without re-tokenising anything: a call
whose prompt extends the previous call's prompt + completion token for token joins the previous
segment (the tokens in between, tool results and chat-template glue, are masked out of the loss);
a call that does not (the agent rewrote its history) starts a new segment, and the break is counted.

The chat route keeps this exact: when a rollout's next conversation, rendered by the chat
template, starts with the text of an earlier call's prompt + completion, the new prompt is that
call's exact token ids followed by the tokens of the new text only (``reuse_sampled_ids``), so an
agent that sends back what the model said (and appends tool results) extends its sequence even
where re-tokenising the model's text would give other ids.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telescope.core.inference.gateway.errors import GatewayError

if TYPE_CHECKING:
    from telescope.core.inference.server_client import ServerClient

__all__ = [
    "KEY_PREFIX",
    "CaptureRegistry",
    "CaptureSession",
    "CapturedCall",
    "RolloutLimits",
    "Segment",
    "assemble",
    "reuse_sampled_ids",
]

#: Every rollout key starts with this, so an unknown one is told apart from a wrong run secret.
KEY_PREFIX = "tsk-rollout-"
#: Ended keys remembered (so a late call is answered "ended", not "unknown").
ENDED_KEYS_KEPT = 4096


@dataclass
class CapturedCall:
    """One choice of one call, as sampled."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    weight_versions: list[int] | None
    text: str = ""
    """The choice's text as the agent received it (for records; never re-tokenised)."""
    seen_text: str | None = None
    """Prompt + completion ids decoded with special tokens (filled by the gateway when first needed)."""


@dataclass(frozen=True)
class RolloutLimits:
    """What one rollout may spend through the gateway."""

    max_calls: int | None = None
    """Most calls (a call with ``n`` choices counts once); the next one is refused."""
    max_completion_tokens: int | None = None
    """Most completion tokens over all calls; a call's ``max_tokens`` is lowered to what is left."""


@dataclass
class CaptureSession:
    """One rollout's credential and its recorded calls."""

    key: str
    rollout_id: str
    limits: RolloutLimits = RolloutLimits()
    client: ServerClient | None = None
    """The engine this rollout's calls go to (None: the gateway's own)."""
    forced: dict[str, Any] = field(default_factory=dict)
    """Engine parameters that override the agent's (a training run's temperature and top_p)."""
    calls: list[CapturedCall] = field(default_factory=list)
    num_calls: int = 0
    completion_tokens: int = 0
    ended: bool = False

    def admit(self) -> int | None:
        """Check the rollout may call now; returns the completion tokens it has left (None: no limit)."""
        if self.ended:
            raise GatewayError(
                f"rollout {self.rollout_id} has ended: its key takes no more calls (a call made after the "
                "rollout returned is never trained)",
                code="rollout_ended",
                status=403,
            )
        if self.limits.max_calls is not None and self.num_calls >= self.limits.max_calls:
            raise GatewayError(
                f"rollout {self.rollout_id} made its {self.limits.max_calls} calls (max turns); "
                "raise the environment's max_turns to allow more",
                code="max_turns",
                status=403,
            )
        if self.limits.max_completion_tokens is None:
            return None
        left = self.limits.max_completion_tokens - self.completion_tokens
        if left <= 0:
            raise GatewayError(
                f"rollout {self.rollout_id} used its {self.limits.max_completion_tokens} completion tokens; "
                "raise the environment's max_rollout_tokens to allow more",
                code="max_tokens",
                status=403,
            )
        return left

    def record(self, calls: list[CapturedCall]) -> None:
        """Keep one call's choices (dropped when the rollout ended while the call ran)."""
        if self.ended:
            return
        self.num_calls += 1
        self.completion_tokens += sum(len(c.completion_ids) for c in calls)
        self.calls.extend(calls)


class CaptureRegistry:
    """The open rollout sessions of one gateway, by key."""

    def __init__(self) -> None:
        self._open: dict[str, CaptureSession] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()

    def open(
        self,
        rollout_id: str,
        *,
        limits: RolloutLimits | None = None,
        client: ServerClient | None = None,
        forced: dict[str, Any] | None = None,
    ) -> CaptureSession:
        """A new session with a fresh random key."""
        session = CaptureSession(
            key=KEY_PREFIX + secrets.token_hex(16),
            rollout_id=rollout_id,
            limits=limits or RolloutLimits(),
            client=client,
            forced=dict(forced or {}),
        )
        self._open[session.key] = session
        return session

    def close(self, session: CaptureSession) -> list[CapturedCall]:
        """End the session: its key is refused from now on. Returns its calls."""
        session.ended = True
        self._open.pop(session.key, None)
        self._ended[session.key] = session.rollout_id
        while len(self._ended) > ENDED_KEYS_KEPT:
            self._ended.popitem(last=False)
        return list(session.calls)

    def lookup(self, key: str) -> CaptureSession | None:
        """The session of ``key``; None when ``key`` is not a rollout key. Raises for an ended one."""
        session = self._open.get(key)
        if session is not None:
            return session
        if key in self._ended:
            raise GatewayError(
                f"rollout {self._ended[key]} has ended: its key takes no more calls",
                code="rollout_ended",
                status=403,
            )
        return None

    @staticmethod
    def is_rollout_key(key: str) -> bool:
        """Whether ``key`` looks like a rollout key (an unknown one is refused, never taken as a secret)."""
        return key.startswith(KEY_PREFIX)

    def __len__(self) -> int:
        return len(self._open)


@dataclass
class Segment:
    """A trained sequence made of one or more calls: prompt, then completion and glue tokens."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    """Everything after the first prompt: sampled tokens and the tokens between calls."""
    loss_mask: list[bool] = field(default_factory=list)
    """Per completion token: True for sampled tokens, False for tool results and template glue."""
    logprobs: list[float] = field(default_factory=list)
    """Per completion token: the sampling logprob (0.0 where masked)."""
    turns: list[CapturedCall] = field(default_factory=list)
    """The calls joined into this segment, in order."""
    summary: bool = False
    """A compaction's summary: the completion is the summary the policy wrote (``rollouts/compaction.py``)."""

    @property
    def tokens(self) -> list[int]:
        """The whole sequence."""
        return self.prompt_ids + self.completion_ids

    def extend(self, call: CapturedCall) -> bool:
        """Join ``call`` when its prompt extends this sequence token for token; False otherwise."""
        sequence = self.tokens
        if len(call.prompt_ids) < len(sequence) or call.prompt_ids[: len(sequence)] != sequence:
            return False
        glue = call.prompt_ids[len(sequence) :]
        self._append(glue, [False] * len(glue), [0.0] * len(glue))
        self._append(call.completion_ids, [True] * len(call.completion_ids), call.logprobs)
        self.turns.append(call)
        return True

    def _append(self, ids: list[int], mask: list[bool], logprobs: list[float]) -> None:
        self.completion_ids += ids
        self.loss_mask += mask
        self.logprobs += logprobs


def assemble(
    calls: list[CapturedCall],
    summaries: frozenset[int] = frozenset(),
    rejected: frozenset[int] = frozenset(),
    train_summary: bool = True,
) -> tuple[list[Segment], int]:
    """A rollout's calls as segments, and how many times a call broke the prefix (``agent/prefix_breaks``).

    Each call extends the latest segment it continues (an agent that forks a conversation and comes
    back still joins); a call that continues none starts a new segment. Context compaction
    (``AgentEnvironment.maybe_compact``): the calls at ``summaries`` (indices into ``calls``) are
    segments of their own, their completion trained when ``train_summary``; those at ``rejected``
    (summary attempts refused) are in no segment.
    """
    segments: list[Segment] = []
    breaks = 0
    for index, call in enumerate(calls):
        if index in rejected:
            continue
        if index in summaries:
            segment = Segment(prompt_ids=list(call.prompt_ids), summary=True)
            segment._append(call.completion_ids, [train_summary] * len(call.completion_ids), call.logprobs)
            segment.turns.append(call)
            segments.append(segment)
            continue
        conversation = [s for s in segments if not s.summary]
        if conversation and any(s.extend(call) for s in reversed(conversation[-4:])):
            continue
        if conversation:
            breaks += 1
        segment = Segment(prompt_ids=list(call.prompt_ids))
        segment._append(call.completion_ids, [True] * len(call.completion_ids), call.logprobs)
        segment.turns.append(call)
        segments.append(segment)
    return segments, breaks


def reuse_sampled_ids(calls: list[CapturedCall], text: str, tokenizer: Any) -> list[int]:
    """The token ids of prompt ``text``: the latest call whose prompt + completion, decoded, starts
    ``text`` contributes its exact ids, and only the rest of ``text`` is tokenized; else all of it."""
    for call in reversed(calls):
        if call.seen_text is None:
            call.seen_text = str(
                tokenizer.decode(call.prompt_ids + call.completion_ids, skip_special_tokens=False)
            )
        if call.seen_text and text.startswith(call.seen_text):
            rest = text[len(call.seen_text) :]
            tail = list(tokenizer(rest, add_special_tokens=False)["input_ids"]) if rest else []
            return call.prompt_ids + call.completion_ids + tail
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
