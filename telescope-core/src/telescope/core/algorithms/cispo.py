"""CISPO: the REINFORCE gradient weighted by a clipped, stop-gradient importance ratio."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from telescope.core.algorithms.base import Algorithm, LossInputs, TokenLosses, as_float, log_ratio

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Cispo"]


class Cispo(Algorithm):
    """L_t = −sg(clip(r_t, 1 − ε_lo, 1 + ε_hi)) · A_t · ℓ_t.

    Unlike PPO the clipped tokens keep their gradient (only its weight is bounded), so the
    clip fractions count every token whose ratio lies outside the range.
    """

    name = "cispo"
    supports_ppo_clip = False
    uses_ratio = True

    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: TelescopeConfig) -> TokenLosses:
        assert ref is not None
        logprobs = as_float(inputs.logprobs)
        lo, hi = 1.0 - float(cfg.clip_low), 1.0 + float(cfg.clip_high)
        ratio = torch.exp(log_ratio(logprobs.detach(), as_float(ref)))
        weight = torch.clamp(ratio, lo, hi)
        losses = -weight * as_float(inputs.advantages.detach()) * logprobs
        return TokenLosses(losses=losses, clip_low=ratio < lo, clip_high=ratio > hi)
