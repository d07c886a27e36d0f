"""One RL training step over packed micro-batches: minibatches, loss, clipping, optimizer.

Loss normalisation is per minibatch, not per micro-batch: the loss-token and sample counts
handed to the algorithm are totals over every micro-batch and rank of the minibatch, each
micro-batch's loss is its share of that total, and gradients are summed across ranks.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from telescope.core.algorithms.base import Algorithm
from telescope.core.algorithms.logprobs import token_entropy, token_logprobs
from telescope.core.algorithms.metrics import StepMetrics, kl_divergence_sum
from telescope.core.packing import minibatch_groups
from telescope.core.training.aggregate import count, global_loss_counts, step_metrics
from telescope.core.training.tensors import DeviceMicroBatch, loss_inputs
from telescope.core.training.timing import StepTimer
from telescope.fsdp.microbatch import packed_logits
from telescope.fsdp.options import FSDPBackendKwargs

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["TrainState", "run_minibatches"]

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Everything a step needs; built by ``FSDPBackend.init``."""

    cfg: TelescopeConfig
    kwargs: FSDPBackendKwargs
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    algorithm: Algorithm
    device: torch.device
    dp_world_size: int
    counters: dict[str, int] = field(default_factory=dict)


@torch.no_grad()
def old_logprobs(st: TrainState, mbs: list[DeviceMicroBatch], timer: StepTimer) -> list[torch.Tensor]:
    """Logprobs under the weights before this step's first update (``ppo_clip_ref_logprobs: batch``)."""
    out = []
    for mb in mbs:
        with timer.track("old_logprobs", micro_batch=True):
            logits = packed_logits(st.model, mb)
            out.append(token_logprobs(logits, mb.targets, st.cfg.temperature, st.cfg.entropy_chunk_size))
    return out


def micro_batch_backward(
    st: TrainState,
    mb: DeviceMicroBatch,
    old: torch.Tensor | None,
    counts: tuple[float, float],
    timer: StepTimer,
) -> dict[str, torch.Tensor]:
    """Forward, loss share, backward for one micro-batch; returns its loss metrics."""
    cfg = st.cfg
    with timer.track("forward", micro_batch=True):
        logits = packed_logits(st.model, mb)
    with timer.track("compute_entropy", micro_batch=True):
        entropy = token_entropy(logits.detach(), cfg.temperature, cfg.entropy_chunk_size)
    with timer.track("loss_computation", micro_batch=True):
        logprobs = token_logprobs(logits, mb.targets, cfg.temperature, cfg.entropy_chunk_size)
    with timer.track("compute_kl", micro_batch=True):
        kl_sum = kl_divergence_sum(logprobs, mb.inference_logprobs, mb.loss_mask)
    with timer.track("loss_computation", micro_batch=True):  # a second interval of the same phase
        inputs = loss_inputs(mb, logprobs, counts, old_logprobs=old, entropy=entropy, kl_sum=kl_sum)
        out = st.algorithm.policy_loss(inputs, cfg)
    with timer.track("backward", micro_batch=True):
        # FSDP averages gradients over ranks; the loss shares must be summed instead.
        (out.loss * st.dp_world_size).backward()
    return out.metrics


def clip_gradients(st: TrainState, timer: StepTimer) -> float:
    """Clip to ``grad_clip`` and return the total gradient norm (same on every rank)."""
    with timer.track("grad_norm"):
        norm = torch.nn.utils.clip_grad_norm_(st.model.parameters(), st.cfg.grad_clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)


def run_minibatch(
    st: TrainState,
    mbs: list[DeviceMicroBatch],
    olds: list[torch.Tensor | None],
    stats: StepMetrics,
    timer: StepTimer,
) -> float | None:
    """One optimizer step over ``mbs``; returns the grad norm, or None when nothing is trained."""
    counts = global_loss_counts(mbs, st.device)
    if counts[0] == 0:  # no loss token on any rank: every rank skips alike
        count(st.counters, "empty_minibatches")
        return None
    st.optimizer.zero_grad(set_to_none=True)
    for k, (mb, old) in enumerate(zip(mbs, olds, strict=True)):
        if not st.kwargs.sync_gradients_every_micro_batch:
            st.model.set_requires_gradient_sync(k == len(mbs) - 1)  # type: ignore[operator]
        stats.add(micro_batch_backward(st, mb, old, counts, timer))
    norm = clip_gradients(st, timer)
    if math.isfinite(norm):
        with timer.track("optimizer"):
            st.optimizer.step()
        count(st.counters, "optimizer_steps")
    else:
        count(st.counters, "skipped_nonfinite_steps")
        logger.warning(
            "grad norm is %s: optimizer step skipped (counted in train/skipped_nonfinite_steps)", norm
        )
    st.optimizer.zero_grad(set_to_none=True)
    return norm


def run_minibatches(
    st: TrainState, mbs: list[DeviceMicroBatch], minibatch_of_row: list[int], timer: StepTimer
) -> dict[str, float]:
    """Every minibatch of the step (each its own optimizer step); returns loss and grad metrics."""
    cfg = st.cfg
    needs_old = cfg.ppo_clip_ref_logprobs == "batch" and st.algorithm.needs_reference(cfg)
    olds: list[torch.Tensor | None] = list(old_logprobs(st, mbs, timer)) if needs_old else [None] * len(mbs)
    stats = StepMetrics()
    norms: list[float] = []
    groups = minibatch_groups(minibatch_of_row, cfg.number_of_minibatches)
    before = dict(st.counters)
    for group in groups:
        norm = run_minibatch(st, [mbs[i] for i in group], [olds[i] for i in group], stats, timer)
        if norm is not None:
            norms.append(norm)
    stats.all_reduce(device=st.device)
    return step_metrics(stats.result(), norms, st.counters, before, len(groups))
