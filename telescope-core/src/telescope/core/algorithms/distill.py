"""On-policy distillation's signal: the teacher's per-token judgement as an advantage.

The student samples a completion; the teacher gives the logprob of exactly those sampled ids
(prompt excluded). Per completion token t the reverse KL estimate is
``k_t = student_t − teacher_t`` (``student_t``: the logprob the rollout engine reported, the
policy that sampled the token), and the token's advantage is

    A_t = distill_reward_weight · A_reward + distill_kl_coef · (teacher_t − student_t)

where ``A_reward`` is the algorithm's own (group, then batch-normalised) reward advantage. A token
the teacher finds likelier than the student did is pushed up, one it finds less likely is pushed
down: the policy-gradient of −KL(student ‖ teacher) per token. Torch-free (plain lists).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.algorithms.base import Algorithm
    from telescope.core.config import TelescopeConfig

__all__ = ["DistillSignal", "DistillStats", "check_algorithm", "token_advantages"]


def token_advantages(
    student: Sequence[float], teacher: Sequence[float], loss_mask: Sequence[int] | None, kl_coef: float
) -> list[float]:
    """``kl_coef · (teacher_t − student_t)`` per completion token; 0 where ``loss_mask`` is 0
    (environment tokens: the model did not sample them, the teacher's view of them is no signal)."""
    if len(student) != len(teacher):
        raise ValueError(
            f"the teacher scored {len(teacher)} completion tokens but the sample has {len(student)}: "
            "the teacher must return one logprob per sampled completion token"
        )
    mask = loss_mask if loss_mask is not None else [1] * len(student)
    out = []
    for s, t, m in zip(student, teacher, mask, strict=True):
        if not (math.isfinite(s) and math.isfinite(t)):
            if m:
                raise ValueError(f"non-finite logprob on a trained token (student {s}, teacher {t})")
            out.append(0.0)
            continue
        out.append(kl_coef * (t - s) if m else 0.0)
    return out


@dataclass
class DistillStats:
    """Running sums over one batch's trained tokens (``distill/*`` step metrics)."""

    tokens: int = 0
    reverse_kl_sum: float = 0.0
    teacher_logprob_sum: float = 0.0
    teacher_seconds: list[float] | None = None

    def add(
        self, student: Sequence[float], teacher: Sequence[float], loss_mask: Sequence[int] | None
    ) -> None:
        mask = loss_mask if loss_mask is not None else [1] * len(student)
        for s, t, m in zip(student, teacher, mask, strict=True):
            if m:
                self.tokens += 1
                self.reverse_kl_sum += s - t
                self.teacher_logprob_sum += t

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1)
        out = {
            "distill/reverse_kl": self.reverse_kl_sum / n,
            "distill/teacher_logprob_mean": self.teacher_logprob_sum / n,
        }
        if self.teacher_seconds:
            out["distill/teacher_seconds"] = sum(self.teacher_seconds) / len(self.teacher_seconds)
        return out


@dataclass(frozen=True)
class DistillSignal:
    """How a run mixes the teacher's signal with the reward's (from the config)."""

    kl_coef: float
    reward_weight: float

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> DistillSignal | None:
        """The run's mix, or None when it has no teacher."""
        if cfg.distill_teacher_model is None:
            return None
        return cls(float(cfg.distill_kl_coef), float(cfg.distill_reward_weight))


def check_algorithm(algorithm: Algorithm) -> None:
    """Refuse an algorithm whose loss cannot take a per-token advantage (it would be averaged away)."""
    if not algorithm.supports_token_advantages:
        raise ValueError(
            f"on-policy distillation (distill_teacher_model) is not supported by algorithm "
            f"'{algorithm.name}': its loss uses one advantage per sequence, which would average the "
            "teacher's per-token signal away; use grpo, rloo, reinforce_pp, dr_grpo, cispo or sapo"
        )
