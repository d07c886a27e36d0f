"""``LossInputs``: one packed micro-batch as the losses and the metrics read it (torch tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LossInputs"]


@dataclass(kw_only=True)
class LossInputs:
    """One packed micro-batch, as 1-D per-token tensors of equal length (keyword-only).

    Element t of every tensor refers to the same (already shifted) target token. A sample
    starts where its position does not follow the previous token's (at 0, or past a prompt
    prefix shared with the sample before it); padding and prompt/environment tokens have
    ``loss_mask == 0``.
    """

    logprobs: torch.Tensor
    """ℓ: trainer logprobs under the current weights (with grad), from ``logits / temperature``."""
    inference_logprobs: torch.Tensor
    """μ: logprobs the rollout engine reported for the sampled tokens (no grad)."""
    advantages: torch.Tensor
    """A_t: the sample's advantage, repeated on each of its tokens."""
    loss_mask: torch.Tensor
    """m_t: 1 (or True) where the token is trained on, else 0."""
    position_ids: torch.Tensor
    """Position of the token inside its sample; restarts at 0 for each packed sample."""
    num_loss_tokens: int | float | torch.Tensor
    """Σ m_t over the whole minibatch (all micro-batches, all ranks): token_mean's denominator."""
    num_samples: int | float | torch.Tensor
    """Samples in the whole minibatch (all micro-batches, all ranks): token_sum_norm's N."""
    old_logprobs: torch.Tensor | None = None
    """Trainer logprobs before this step's first update; required when
    ``ppo_clip_ref_logprobs == "batch"`` and the algorithm uses a ratio."""
    entropy: torch.Tensor | None = None
    """Optional per-token entropy (from ``token_entropy``, no grad): adds the ``entropy`` metric."""
    kl_sum: torch.Tensor | None = None
    """Optional precomputed Σ m_t k3(ℓ_t, μ_t) (``metrics.kl_divergence_sum``), so a trainer can
    time the KL on its own (``timing_compute_kl``); computed in ``policy_loss`` when None."""
