"""GSPO: one sequence-level importance ratio per sample, PPO-clipped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from telescope.core.algorithms.base import Algorithm, LossInputs, TokenLosses, as_float
from telescope.core.algorithms.reinforce import ppo_clip_losses

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Gspo", "sample_ids"]

#: ρ_t = exp(min(λ_t, MAX_LOG_RATIO)).
MAX_LOG_RATIO = 10.0


def sample_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Index of the packed sample each token belongs to: a sample starts where the position does
    not follow the previous token's (at 0, or past a shared prefix: ``packing.share_prefixes``).

    The first token always opens a sample, even if its position is not 0.
    """
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    if starts.numel() > 1:
        starts[1:] = position_ids[1:] != position_ids[:-1] + 1
    return torch.cumsum(starts.long(), dim=0) - 1


class Gspo(Algorithm):
    """Sequence ratio s_i = mean over T_i of (ℓ − ref), applied to every token of sample i.

    λ_t = (ℓ_t − ref_t)/|T_i| − sg((ℓ_t − ref_t)/|T_i|) + sg(s_i): its value is s_i and its
    gradient ∇ℓ_t/|T_i|; ρ_t = exp(min(λ_t, 10)); Â_i = mean of A over T_i;
    L_t = max(−ρ_t Â_i, −clip(ρ_t, 1 − ε_lo, 1 + ε_hi) Â_i).
    """

    name = "gspo"
    supports_ppo_clip = False
    uses_ratio = True
    supports_token_advantages = False  # Â_i averages A over the sequence

    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: TelescopeConfig) -> TokenLosses:
        assert ref is not None
        mask = inputs.loss_mask.to(torch.float32)
        ids = sample_ids(inputs.position_ids)
        num = ids.numel()  # an upper bound on the sample count: no device sync
        count = _segment_sum(mask, ids, num).clamp(min=1.0)[ids]
        delta = (as_float(inputs.logprobs) - as_float(ref)) * mask
        per_token = delta / count
        seq_log_ratio = _segment_sum(per_token.detach(), ids, num)[ids]
        lam = per_token - per_token.detach() + seq_log_ratio
        ratio = torch.exp(torch.clamp(lam, max=MAX_LOG_RATIO))
        seq_adv = (_segment_sum(as_float(inputs.advantages.detach()) * mask, ids, num)[ids]) / count
        return ppo_clip_losses(ratio, seq_adv, float(cfg.clip_low), float(cfg.clip_high))


def _segment_sum(values: torch.Tensor, ids: torch.Tensor, num: int) -> torch.Tensor:
    return torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, ids, values)
