"""Loss metrics: per-micro-batch statistics and their token-weighted accumulation over a step.

``policy_loss`` returns detached 0-d tensors whose key says how they combine:
``*_sum`` are sums over loss tokens (the step value is the sum divided by ``loss_tokens``),
``*_min``/``*_max`` combine by min/max, and every other key (``loss``, ``loss_tokens``) is a
plain sum. ``StepMetrics`` accumulates micro-batches, all-reduces across ranks and turns the
sums into token-weighted means, so a metric is the same whatever the packing or rank count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from telescope.core.algorithms.inputs import LossInputs

__all__ = [
    "StepMetrics",
    "base_metrics",
    "clip_metrics",
    "kl_divergence_inference",
    "kl_divergence_sum",
    "tis_metrics",
]


def as_float(t: torch.Tensor) -> torch.Tensor:
    """Half precision up to float32; float64 stays (so float64 tests are exact)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def kl_divergence_inference(
    logprobs: torch.Tensor, inference_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Mean over loss tokens of exp(ℓ − μ) − 1 − (ℓ − μ) (the k3 estimator), no grad."""
    return kl_divergence_sum(logprobs, inference_logprobs, loss_mask) / loss_mask.to(
        torch.float32
    ).sum().clamp(min=1.0)


def kl_divergence_sum(
    logprobs: torch.Tensor, inference_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Σ over loss tokens of the k3 estimator (no grad): what ``kl_divergence_inference`` averages."""
    return _kl_sum(logprobs, inference_logprobs, loss_mask.to(torch.float32))


def _kl_sum(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    delta = as_float(logprobs.detach() - inference_logprobs.detach())
    return ((torch.exp(delta) - 1.0 - delta) * mask).sum()


def base_metrics(inputs: LossInputs, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics every algorithm reports: token count, KL to the rollout policy, entropy."""
    # No advantage statistics here: ``advantage/{mean,std,min,max}`` come from the rollout
    # records (``telescope.core.observe.rollout_metrics``), one value per sample as the
    # environment group produced it; a token-weighted copy from the trainer disagreed with them.
    stats = {
        "loss_tokens": mask.sum(),
        "kl_divergence_inference_sum": inputs.kl_sum.detach()
        if inputs.kl_sum is not None
        else _kl_sum(inputs.logprobs, inputs.inference_logprobs, mask),
    }
    if inputs.entropy is not None:
        stats["entropy_sum"] = (as_float(inputs.entropy.detach()) * mask).sum()
    return stats


def tis_metrics(weights: torch.Tensor, capped: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """TIS weight mean and the fraction of loss tokens whose weight hit ``tis_cap``."""
    return {"tis_weight_sum": (weights * mask).sum(), "tis_capped_frac_sum": (capped.float() * mask).sum()}


def clip_metrics(
    low: torch.Tensor | None, high: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Fractions of loss tokens where the lower / upper clip bound is active."""
    stats = {}
    if low is not None:
        stats["clip_low_frac_sum"] = (low.float() * mask).sum()
    if high is not None:
        stats["clip_high_frac_sum"] = (high.float() * mask).sum()
    return stats


def _reduction(key: str) -> str:
    if key.endswith("_min"):
        return "min"
    if key.endswith("_max"):
        return "max"
    return "sum"


class StepMetrics:
    """Token-weighted accumulation of ``LossOutputs.metrics`` over micro-batches and ranks."""

    def __init__(self) -> None:
        self._values: dict[str, torch.Tensor] = {}

    def add(self, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """Fold one micro-batch's metrics in (no device sync happens here)."""
        for key, value in metrics.items():
            v = torch.as_tensor(value).detach().to(torch.float64)
            old = self._values.get(key)
            if old is None:
                self._values[key] = v.clone()
            else:
                kind = _reduction(key)
                v = v.to(old.device)
                self._values[key] = (
                    old + v if kind == "sum" else (old.minimum(v) if kind == "min" else old.maximum(v))
                )

    def all_reduce(self, group: Any = None, device: torch.device | str | None = None) -> None:
        """Combine the accumulators of every rank (no-op without an initialised process group).

        Every rank must have added the same keys (they depend only on the config).
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or not self._values:
            return
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        for kind, op in ops.items():
            keys = sorted(k for k in self._values if _reduction(k) == kind)
            if not keys:
                continue
            packed = torch.stack([self._values[k].to(device or self._values[k].device) for k in keys])
            dist.all_reduce(packed, op=op, group=group)
            for i, k in enumerate(keys):
                self._values[k] = packed[i]

    def result(self) -> dict[str, float]:
        """Final values (one device sync): ``X_sum`` becomes ``X`` = sum / loss_tokens.

        ``loss`` is the sum of the added shares, i.e. the minibatch loss (the
        sum over minibatches when several were added). Min/max and means are left out when
        there were no loss tokens.
        """
        vals = {k: float(v) for k, v in self._values.items()}
        tokens = vals.get("loss_tokens", 0.0)
        out: dict[str, float] = {}
        for key, value in vals.items():
            if key.endswith("_sum"):
                if tokens > 0:
                    out[key[: -len("_sum")]] = value / tokens
            elif math.isfinite(value) or _reduction(key) == "sum":
                out[key] = value
        return out
