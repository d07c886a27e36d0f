"""The REINFORCE family: GRPO, RLOO, REINFORCE++ and DR-GRPO.

They differ only in their advantages and (DR-GRPO) the loss aggregation; the per-token
loss is −ℓ_t · A_t, or the PPO clipped surrogate max(−r_t A_t, −clip(r_t, 1−ε_lo, 1+ε_hi) A_t)
when ``use_ppo_clip`` is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from telescope.core.algorithms import advantages as adv
from telescope.core.algorithms.base import Algorithm, LossInputs, TokenLosses, as_float, log_ratio

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["DrGrpo", "Grpo", "ReinforcePlusPlus", "Rloo", "ppo_clip_losses"]


def ppo_clip_losses(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> TokenLosses:
    """max(−ρ A, −clip(ρ, 1−ε_lo, 1+ε_hi) A), and where each clip bound is the active term.

    The lower bound binds when ρ < 1−ε_lo and A < 0; the upper one when ρ > 1+ε_hi and A > 0
    (those are the tokens whose gradient the clip removes).
    """
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, lo, hi) * advantages
    losses = torch.maximum(unclipped, clipped)
    ratio_d = ratio.detach()
    return TokenLosses(
        losses=losses,
        clip_low=(ratio_d < lo) & (advantages < 0),
        clip_high=(ratio_d > hi) & (advantages > 0),
    )


class _Reinforce(Algorithm):
    """−ℓ_t · A_t, or the PPO clipped surrogate with ``use_ppo_clip``."""

    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: TelescopeConfig) -> TokenLosses:
        advantages = as_float(inputs.advantages.detach())
        if cfg.use_ppo_clip:
            assert ref is not None  # needs_reference() is True with PPO clip
            ratio = torch.exp(log_ratio(as_float(inputs.logprobs), as_float(ref)))
            return ppo_clip_losses(ratio, advantages, float(cfg.clip_low), float(cfg.clip_high))
        return TokenLosses(losses=-as_float(inputs.logprobs) * advantages)


class Grpo(_Reinforce):
    """GRPO: group z-score advantages (x − mean) / (std + 1e-4)."""

    name = "grpo"


class Rloo(_Reinforce):
    """RLOO: leave-one-out baseline, (x − mean) · n / (n − 1)."""

    name = "rloo"
    advantage_norms = ("group",)

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return adv.leave_one_out(rewards)


class ReinforcePlusPlus(_Reinforce):
    """REINFORCE++: group-centred rewards, whitened over the whole training batch."""

    name = "reinforce_pp"
    advantage_norms = ("batch",)
    default_advantage_norm = "batch"


class DrGrpo(_Reinforce):
    """DR-GRPO: x − mean (no std division); optional ``token_sum_norm`` aggregation."""

    name = "dr_grpo"
    advantage_norms = ("group",)

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return adv.center(rewards) if rewards.shape[-1] > 1 else torch.zeros_like(rewards)

    def aggregation_mode(self, cfg: TelescopeConfig) -> str:
        return cfg.dr_grpo_loss_agg_mode
