"""Context compaction of multi-turn rollouts, in token ids: segments, summaries, masks.

A rollout is a list of segments (``inference.gateway.capture.Segment``), each trained as its own
sequence with the rollout's advantage. Without compaction there is one: the first prompt, then
every turn's sampled ids (trained) and the environment's ids between them (masked). When the next
prompt would pass ``context_compaction_at_tokens``, the policy is asked for a summary:

- the conversation segment ends with the last turn it trained;
- the summary is a segment of its own: its prompt is the whole conversation plus the request (never
  trained), its completion the summary ids exactly as sampled (trained once, or masked with
  ``context_compaction_train_summary: false``); rejected attempts are in no segment;
- the next segment starts from the restart messages (system prompt + task + summary + the
  environment's latest reply, ``env.compaction.Compactor.restart``) tokenized once: what the server
  is sent, and what the trainer sees.

So every trained token is one the policy sampled, in the sequence it was sampled in, and in exactly
one segment. A summary that stays unusable after ``context_compaction_attempts`` tries ends the
rollout with ``CompactionFailed`` (defined in ``env.compaction``, which agents raise it from too): an
infrastructure outcome (cause ``compaction_failed``), so the sample is retried, then masked
(``rollouts/outcomes.py``), never scored as a reward of 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from telescope.core.env.compaction import CompactionFailed, compaction_failed
from telescope.core.inference.gateway.capture import Segment

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["CompactionFailed", "CompactionSettings", "Conversation", "compaction_failed", "segment_records"]


@dataclass(frozen=True)
class CompactionSettings:
    """The ``context_compaction_*`` settings of a run."""

    at_tokens: int
    max_per_rollout: int = 4
    train_summary: bool = True
    attempts: int = 2

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> CompactionSettings | None:
        """The run's settings; None when compaction is off (``context_compaction_at_tokens: null``)."""
        if cfg.context_compaction_at_tokens is None:
            return None
        return cls(
            cfg.context_compaction_at_tokens,
            cfg.context_compaction_max_per_rollout,
            cfg.context_compaction_train_summary,
            cfg.context_compaction_attempts,
        )


@dataclass
class Conversation:
    """The segments of one multi-turn rollout: the finished ones and the one being extended."""

    current: Segment
    finished: list[Segment] = field(default_factory=list)
    compactions: int = 0

    @classmethod
    def start(cls, prompt_ids: list[int]) -> Conversation:
        return cls(Segment(prompt_ids=list(prompt_ids)))

    @property
    def tokens(self) -> list[int]:
        """The current segment's whole sequence: the next request's prompt."""
        return self.current.tokens

    def sampled(self, ids: list[int], logprobs: list[float], trained: bool = True) -> None:
        """Append what the policy sampled (trained)."""
        self.current._append(list(ids), [trained] * len(ids), list(logprobs))

    def glue(self, ids: list[int]) -> None:
        """Append tokens the policy did not sample (environment replies, template glue): masked."""
        self.current._append(list(ids), [False] * len(ids), [0.0] * len(ids))

    def compacted(self, summary: Segment, restart_ids: list[int]) -> None:
        """Close the current segment, add ``summary`` and start the next segment at ``restart_ids``."""
        self.finished += [self.current, summary]
        self.current = Segment(prompt_ids=list(restart_ids))
        self.compactions += 1

    def segments(self) -> list[Segment]:
        """Every segment in order; the current one is last (an empty one after a compaction that the
        rollout never continued is left out: it trains nothing)."""
        tail = [self.current] if self.current.completion_ids or not self.finished else []
        return [*self.finished, *tail]

    def metrics(self) -> dict[str, float]:
        """``agent/compactions``, ``agent/segments_per_rollout``, ``agent/context_tokens_max``."""
        segments = self.segments()
        return {
            "agent/compactions": float(self.compactions),
            "agent/segments_per_rollout": float(len(segments)),
            "agent/context_tokens_max": float(max(len(s.tokens) for s in segments)),
        }


def summary_segment(prompt_ids: list[int], ids: list[int], logprobs: list[float], trained: bool) -> Segment:
    """The summary's own segment: the conversation + request as prompt, the sampled summary as completion."""
    return Segment(
        prompt_ids=list(prompt_ids),
        completion_ids=list(ids),
        loss_mask=[trained] * len(ids),
        logprobs=list(logprobs),
        summary=True,
    )


def segment_records(segments: list[Segment], texts: list[str]) -> list[dict[str, object]]:
    """What the run directory keeps of each segment (the dashboard shows them, summaries marked)."""
    return [
        {
            "kind": "summary" if s.summary else "conversation",
            "prompt_tokens": len(s.prompt_ids),
            "completion_tokens": len(s.completion_ids),
            "trained_tokens": sum(s.loss_mask),
            "text": text,
        }
        for s, text in zip(segments, texts, strict=True)
    ]
