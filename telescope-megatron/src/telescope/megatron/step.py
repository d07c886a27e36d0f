"""One RL training step through Megatron's ``forward_backward_func`` (GPU path).

Run so far only on CPU with real megatron-core 0.19.2 (local spec, fp32, no recompute, DP 1
and 2, plain Megatron optimizer): loss and grad norm equal the FSDP backend's over two steps.
Never run: CUDA, TE packed (thd) rows, bf16, pipeline-parallel schedules, distributed optimizer,
CPU offload; see tests/megatron/test_gpu.py.

Loss normalisation matches the FSDP backend: per minibatch, the loss-token and sample counts
are totals over every micro-batch and data-parallel rank, and each micro-batch's loss is its
share of that total. Megatron divides the returned loss by ``num_microbatches`` (2-tuple loss
function form) and its DDP averages gradients over DP ranks, so the share is multiplied by
both to make the gradients the plain sum of shares.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.core.algorithms.base import Algorithm
from telescope.core.algorithms.logprobs import token_entropy, token_logprobs
from telescope.core.algorithms.metrics import StepMetrics
from telescope.core.packing import MicroBatch, minibatch_groups
from telescope.core.training.aggregate import count, global_loss_counts, step_metrics
from telescope.core.training.tensors import DeviceMicroBatch, loss_inputs, to_device
from telescope.core.training.timing import StepTimer
from telescope.megatron.model import BuiltModel
from telescope.megatron.packed import packed_boundaries, pad_row, split_segments, to_packed_seq_params
from telescope.megatron.vocab_parallel import vocab_parallel_logprobs_and_entropy

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["MegatronState", "model_call_kwargs", "run_minibatches"]

logger = logging.getLogger(__name__)


@dataclass
class MegatronState:
    """Everything a step needs; built by ``MegatronBackend.init``."""

    cfg: TelescopeConfig
    built: BuiltModel
    optimizer: Any
    algorithm: Algorithm
    device: torch.device
    row_multiple: int
    use_te: bool
    scheduler_step: int = 0
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class _Item:
    mb: DeviceMicroBatch
    packed_seq_params: Any
    old: torch.Tensor | None = None


def prepare_rows(st: MegatronState, rows: list[MicroBatch]) -> list[_Item]:
    """Device tensors per micro-batch: packed rows (TE, thd) or one sample per row (local spec)."""
    items = []
    for row in rows:
        parts = [pad_row(row, st.row_multiple)] if st.use_te else split_segments(row)
        for part in parts:
            psp = to_packed_seq_params(packed_boundaries(part), st.device) if st.use_te else None
            items.append(_Item(to_device(part, st.device), psp))
    if not items and rows:  # only padding rows here: run one (zero loss) so collectives line up
        items.append(_Item(to_device(rows[0], st.device), None))
    return items


def _logprobs_entropy(
    st: MegatronState, logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from megatron.core import parallel_state as ps

    cfg, vocab = st.cfg, st.built.spec.vocab_size
    if ps.get_tensor_model_parallel_world_size() == 1:
        real = logits[:, :vocab]  # drop Megatron's vocabulary padding
        entropy = token_entropy(real.detach(), cfg.temperature, cfg.entropy_chunk_size)
        return token_logprobs(real, targets, cfg.temperature, cfg.entropy_chunk_size), entropy
    return vocab_parallel_logprobs_and_entropy(
        logits,
        targets,
        vocab_start=ps.get_tensor_model_parallel_rank() * logits.shape[-1],
        vocab_size=vocab,
        temperature=cfg.temperature,
        group=ps.get_tensor_model_parallel_group(),
    )


def _loss(
    st: MegatronState, counts: tuple[float, float], scale: float, item: _Item, output: torch.Tensor
) -> Any:
    """Megatron calls ``loss_func(output)``; ``_forward_step`` bound ``item``, ``run_minibatch`` the rest."""
    logits = output[0, :-1]  # [L-1, V_local] predicting the next token
    logprobs, entropy = _logprobs_entropy(st, logits, item.mb.targets)
    inputs = loss_inputs(item.mb, logprobs, counts, old_logprobs=item.old, entropy=entropy)
    out = st.algorithm.policy_loss(inputs, st.cfg)
    return out.loss * scale, {k: v.detach() for k, v in out.metrics.items()}


def _logprobs_only(st: MegatronState, item: _Item, output: torch.Tensor) -> Any:
    logprobs, _ = _logprobs_entropy(st, output[0, :-1], item.mb.targets)
    return output.new_zeros(()), {"logprobs": logprobs.detach()}


def model_call_kwargs(config: Any) -> dict[str, Any]:
    """Extra keyword arguments of the model call. In bf16/fp16 the model is wrapped in Megatron's
    ``Float16Module``, which by default (``fp32_output=True``) upcasts the last stage's whole logits
    ``[L, V]`` to fp32 at once; the logprob and entropy code upcasts chunk by chunk (``token_logprobs``,
    ``entropy_chunk_size``) or per vocabulary shard, from the same bf16 values (bit-identical results),
    so the logits stay in the compute dtype."""
    return {"fp32_output": False} if (config.bf16 or config.fp16) else {}


def _forward_step(st: MegatronState, loss_fn: Any, data_iterator: Any, model: Any) -> Any:
    item = next(data_iterator)
    output = model(
        item.mb.input_ids,
        item.mb.position_ids,
        None,
        packed_seq_params=item.packed_seq_params,
        **model_call_kwargs(st.built.config),
    )
    return output, partial(loss_fn, item)


def _run(st: MegatronState, items: list[_Item], loss_fn: Any, forward_only: bool) -> list[dict[str, Any]]:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=partial(_forward_step, st, loss_fn),
        data_iterator=iter(items),
        model=st.built.chunks,
        num_microbatches=len(items),
        seq_length=max(item.mb.input_ids.shape[1] for item in items),
        micro_batch_size=1,
        forward_only=forward_only,
    )


@torch.no_grad()
def attach_old_logprobs(st: MegatronState, items: list[_Item], timer: StepTimer) -> None:
    """Logprobs under the weights before this step's first update (``ppo_clip_ref_logprobs: batch``)."""
    with timer.track("old_logprobs"):
        outputs = _run(st, items, partial(_logprobs_only, st), forward_only=True)
    for item, out in zip(items, outputs, strict=False):  # empty on non-last pipeline stages
        item.old = out["logprobs"]


def run_minibatch(
    st: MegatronState, items: list[_Item], stats: StepMetrics, timer: StepTimer
) -> float | None:
    """One optimizer step over ``items``; the grad norm, or None when no rank has a loss token."""
    from megatron.core import parallel_state as ps

    counts = global_loss_counts([i.mb for i in items], st.device, ps.get_data_parallel_group())
    if counts[0] == 0:
        count(st.counters, "empty_minibatches")
        return None
    for chunk in st.built.chunks:
        chunk.zero_grad_buffer()
    st.optimizer.zero_grad()
    scale = float(len(items) * ps.get_data_parallel_world_size())
    with timer.track("forward_backward"):
        outputs = _run(st, items, partial(_loss, st, counts, scale), forward_only=False)
    for out in outputs:
        stats.add(out)
    with timer.track("optimizer"):
        ok, grad_norm, _ = st.optimizer.step()
    if ok:
        count(st.counters, "optimizer_steps")
        return float(grad_norm)
    count(st.counters, "skipped_nonfinite_steps")
    logger.warning("non-finite gradients: optimizer step skipped (counted in train/skipped_nonfinite_steps)")
    return float("nan")


def run_minibatches(st: MegatronState, rows: list[MicroBatch], timer: StepTimer) -> dict[str, float]:
    """Every minibatch of the step (each its own optimizer step); metrics equal on all ranks."""
    cfg = st.cfg
    groups = minibatch_groups([r.minibatch for r in rows], cfg.number_of_minibatches)
    with timer.track("data_to_device"):
        items_per_group = [prepare_rows(st, [rows[i] for i in g]) for g in groups]
    if cfg.ppo_clip_ref_logprobs == "batch" and st.algorithm.needs_reference(cfg):
        for items in items_per_group:
            attach_old_logprobs(st, items, timer)
    stats, norms, before = StepMetrics(), [], dict(st.counters)
    for items in items_per_group:
        norm = run_minibatch(st, items, stats, timer)
        if norm is not None:
            norms.append(norm)
    return step_metrics(_reduce_loss_metrics(stats), norms, st.counters, before, len(groups))


def _reduce_loss_metrics(stats: StepMetrics) -> dict[str, float]:
    """Loss metrics live on the last pipeline stage: reduce over its DP ranks, then broadcast
    to every stage so all ranks return the same metrics."""
    from megatron.core import parallel_state as ps

    result: list[Any] = [None]
    if ps.is_pipeline_last_stage():
        stats.all_reduce(group=ps.get_data_parallel_group())
        result[0] = stats.result()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        group = ps.get_pipeline_model_parallel_group()
        src = dist.get_global_rank(group, ps.get_pipeline_model_parallel_world_size() - 1)
        dist.broadcast_object_list(result, src=src, group=group)
    return dict(result[0])
