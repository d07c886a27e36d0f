"""Step bookkeeping shared by the trainer backends (FSDP, Megatron).

A step runs one optimizer step per minibatch; these helpers count what happened to each
(``count``), total the loss-normalisation counts over ranks (``global_loss_counts``) and
fold the per-minibatch results into the step's metrics (``step_metrics``), so every backend
reports ``loss``, ``grad_norm`` and the ``train/*`` counters the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["COUNTER_NAMES", "count", "global_loss_counts", "step_metrics"]

COUNTER_NAMES = ("optimizer_steps", "skipped_nonfinite_steps", "empty_minibatches")
"""Counters every backend keeps, reported per step as ``train/<name>``."""


def count(counters: dict[str, int], name: str) -> None:
    """Add one to the run-long counter ``name`` (a plain dict, so checkpoints store it as is)."""
    if name not in COUNTER_NAMES:
        raise ValueError(f"unknown step counter {name!r}; expected one of {COUNTER_NAMES}")
    counters[name] = counters.get(name, 0) + 1


def global_loss_counts(rows: Sequence[Any], device: Any, group: Any = None) -> tuple[float, float]:
    """(loss tokens, samples) of ``rows`` (objects with ``num_loss_tokens`` and ``num_samples``)
    summed over every rank of ``group`` (all ranks when None; no reduction without a process group)."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor(
        [float(sum(r.num_loss_tokens for r in rows)), float(sum(r.num_samples for r in rows))],
        dtype=torch.float64,
        device=device,
    )
    if dist.is_initialized():
        dist.all_reduce(counts, group=group)
    return float(counts[0]), float(counts[1])


def step_metrics(
    loss_metrics: dict[str, float],
    norms: list[float],
    counters: dict[str, int],
    before: dict[str, int],
    num_minibatches: int,
) -> dict[str, float]:
    """The step's metrics from its reduced loss metrics (sums over minibatches) and the grad
    norms of its trained minibatches (NaN for a skipped one): ``loss`` is the mean per trained
    minibatch, ``grad_norm`` the mean of the finite norms (NaN when none), and ``train/<counter>``
    the counts this step added since ``before``."""
    out = dict(loss_metrics)
    finite = [n for n in norms if math.isfinite(n)]
    out["grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
    if "loss" in out and norms:
        out["loss"] /= len(norms)  # sum of minibatch losses -> mean per minibatch
    for name in COUNTER_NAMES:
        out[f"train/{name}"] = float(counters.get(name, 0) - before.get(name, 0))
    out["train/minibatches"] = float(num_minibatches)
    return out
