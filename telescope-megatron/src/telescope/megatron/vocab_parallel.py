"""Token logprobs and entropy from vocabulary-sharded logits (Megatron's ``parallel_output=True``).

Each tensor-parallel rank holds the logits of a contiguous slice of the (padded) vocabulary.
Log-sum-exp, the target logit and the entropy are assembled with all-reduces over the TP group.
The sums that need gradients use an all-reduce whose backward is the identity: every TP rank
computes the same loss from the reduced values (a replica, as in Megatron's vocab-parallel
cross entropy), so each rank's local logits receive exactly their own share of the gradient. Columns at or beyond the real ``vocab_size`` (Megatron's vocabulary padding)
are excluded, so the distribution matches the HF model and the inference engine exactly.

Pure torch.distributed: runs on CPU/gloo too, which is how CI tests it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["vocab_parallel_logprobs_and_entropy"]


class _ReplicaAllReduce(torch.autograd.Function):
    """Sum over ``group`` forward; identity backward (downstream is replicated on every rank)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def vocab_parallel_logprobs_and_entropy(
    local_logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    temperature: float = 1.0,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [T], entropy [T])`` of ``targets`` under ``softmax(logits / temperature)``.

    ``local_logits`` is ``[T, V_local]`` holding global vocabulary columns
    ``vocab_start .. vocab_start + V_local``; ``logprobs`` carries gradients, ``entropy`` does not.
    Every rank of ``group`` must call this with the same ``targets``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for training logprobs, got {temperature}")
    n_local = local_logits.shape[-1]
    real_cols = max(0, min(n_local, vocab_size - vocab_start))  # columns of real tokens here
    z = local_logits.float() / temperature
    if real_cols < n_local:
        z = z.masked_fill(torch.arange(n_local, device=z.device) >= real_cols, float("-inf"))
    shift = z.detach().max(dim=-1).values
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    shifted = z - shift[:, None]
    exp = shifted.exp()
    sum_exp = _ReplicaAllReduce.apply(exp.sum(dim=-1), group)
    lse = sum_exp.log()
    local_target = targets - vocab_start
    here = (local_target >= 0) & (local_target < real_cols)
    picked = shifted.gather(-1, local_target.clamp(0, max(n_local - 1, 0))[:, None]).squeeze(-1)
    picked = _ReplicaAllReduce.apply(torch.where(here, picked, torch.zeros_like(picked)), group)
    logprobs = picked - lse
    with torch.no_grad():
        p = exp / sum_exp.detach()[:, None]
        p_logit = torch.where(p > 0, p * shifted.detach(), torch.zeros_like(p)).sum(dim=-1)
        dist.all_reduce(p_logit, group=group)
        entropy = lse.detach() - p_logit
    return logprobs, entropy
