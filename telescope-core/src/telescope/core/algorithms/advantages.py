"""Advantage estimators: the per-group stage 1 and the batch-wide stage 2.

All functions take float tensors of rewards ``[num_groups, group_size]`` (one row per
prompt group), compute in float64 and return the input's float dtype.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["EPS", "as_rewards", "center", "leave_one_out", "whiten", "zscore"]

#: Added to the standard deviation so a group (or batch) with equal rewards gives 0, not NaN.
EPS = 1e-4


def as_rewards(values: Any, *, what: str = "rewards", ndim: int | None = 2) -> torch.Tensor:
    """``values`` as a floating tensor, checking its rank and that every value is finite."""
    t = torch.as_tensor(values)
    if not t.is_floating_point():
        t = t.to(torch.float32)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{what} must be a {ndim}-D tensor [num_groups, group_size], got shape {tuple(t.shape)}"
        )
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what} contain NaN or inf: {t.tolist()}; fix the reward function")
    return t


def _group_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sample std (ddof=1, 0 for a single sample) of each row, in float64."""
    x64 = x.double()
    mean = x64.mean(dim=-1, keepdim=True)
    if x.shape[-1] < 2:
        return mean, torch.zeros_like(mean)
    return mean, x64.std(dim=-1, unbiased=True, keepdim=True)


def zscore(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO: (x − mean) / (std + 1e-4) per group; 0 when the group has one sample."""
    mean, std = _group_stats(rewards)
    return ((rewards.double() - mean) / (std + EPS)).to(rewards.dtype)


def leave_one_out(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: (x − mean) · n / (n − 1), i.e. x_i − mean of the others; 0 when n = 1."""
    n = rewards.shape[-1]
    if n < 2:
        return torch.zeros_like(rewards)
    mean, _ = _group_stats(rewards)
    return ((rewards.double() - mean) * (n / (n - 1))).to(rewards.dtype)


def center(rewards: torch.Tensor) -> torch.Tensor:
    """x − mean per group (DR-GRPO, and stage 1 of batch norm); x itself when n = 1."""
    if rewards.shape[-1] < 2:
        return rewards.clone()
    mean, _ = _group_stats(rewards)
    return (rewards.double() - mean).to(rewards.dtype)


def whiten(advantages: torch.Tensor) -> torch.Tensor:
    """Stage 2: (A − mean_B) / (std_B + 1e-4) over every element of the batch (ddof=1)."""
    flat = advantages.reshape(1, -1)
    if flat.numel() == 0:
        return advantages.clone()
    mean, std = _group_stats(flat)
    return ((flat.double() - mean) / (std + EPS)).to(advantages.dtype).reshape(advantages.shape)
