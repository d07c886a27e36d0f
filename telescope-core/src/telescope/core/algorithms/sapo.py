"""SAPO: a smooth sigmoid gate on the importance ratio instead of a hard clip."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from telescope.core.algorithms.base import Algorithm, LossInputs, TokenLosses, as_float, log_ratio

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Sapo"]


class Sapo(Algorithm):
    """L_t = −σ(τ (r_t − 1)) · (4 / τ) · A_t, τ = sapo_tau_pos if A_t > 0 else sapo_tau_neg.

    At r = 1 the gate's derivative is exactly 1, so on-policy the gradient is the plain
    policy gradient; far from 1 the gradient decays smoothly instead of being cut.
    """

    name = "sapo"
    supports_ppo_clip = False
    uses_ratio = True

    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: TelescopeConfig) -> TokenLosses:
        assert ref is not None
        advantages = as_float(inputs.advantages.detach())
        ratio = torch.exp(log_ratio(as_float(inputs.logprobs), as_float(ref)))
        tau = torch.where(
            advantages > 0,
            torch.full_like(advantages, float(cfg.sapo_tau_pos)),
            torch.full_like(advantages, float(cfg.sapo_tau_neg)),
        )
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        return TokenLosses(losses=-gate * advantages)
