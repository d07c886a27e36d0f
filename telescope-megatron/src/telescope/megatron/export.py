"""Full, HF-named tensors out of a TP/PP/EP-sharded Megatron model, one parameter at a time (GPU path).

Run so far only on CPU with real megatron-core 0.19.2: TP 2, PP 2 and EP 2 exports equal the HF
weights exactly. ``grad_buffers_freed`` has never run (CUDA-only calls inside).

Per local parameter: all-gather over the tensor-parallel group (the expert-TP group for expert
weights) and rebuild the full tensor with ``mapping.tp.unshard_tensors``; for expert weights
also all-gather over the expert-parallel group (every EP rank's copy of local expert j is a
different global expert). With pipeline parallelism each stage in turn sends its gathered
tensors to global rank 0 over rank 0's pipeline group (metadata first, then the tensor).
Global rank 0 feeds everything through ``MegatronToHFStream`` and yields HF names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from telescope.megatron.mapping.placement import global_name
from telescope.megatron.mapping.tp import expert_index, tp_partition, unshard_tensors
from telescope.megatron.model import BuiltModel, rank_offsets

__all__ = ["grad_buffers_freed", "iter_full_megatron_params"]


def _all_gather(t: torch.Tensor, group: Any) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


def _gathered(
    built: BuiltModel, name: str, param: torch.Tensor, offsets: tuple[int, int]
) -> list[tuple[str, torch.Tensor]]:
    """(global name, full tensor) for one local parameter; every rank of the groups must call it."""
    from megatron.core import parallel_state as ps

    local = param.detach()
    gname = global_name(name, *offsets)
    is_expert = expert_index(gname) is not None
    tp_group = ps.get_expert_tensor_parallel_group() if is_expert else ps.get_tensor_model_parallel_group()
    if dist.get_world_size(tp_group) > 1 and tp_partition(gname) != "replicated":
        local = unshard_tensors(_all_gather(local, tp_group), tp_partition(gname))
    if not is_expert or ps.get_expert_model_parallel_world_size() == 1:
        return [(gname, local)]
    per_rank = built.spec.num_experts // ps.get_expert_model_parallel_world_size()
    copies = _all_gather(local, ps.get_expert_model_parallel_group())
    return [(global_name(name, offsets[0], k * per_rank), t) for k, t in enumerate(copies)]


def _stage_params(built: BuiltModel) -> Iterator[tuple[str, torch.Tensor]]:
    offsets = rank_offsets(built.gpt, built.spec)
    for name, param in built.gpt.named_parameters():
        if name == "output_layer.weight" and built.spec.tie_word_embeddings:
            continue  # the last stage's copy of the shared embedding
        yield from _gathered(built, name, param, offsets)


def iter_full_megatron_params(
    built: BuiltModel, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(global Megatron name, full tensor)`` on global rank 0; collective on every rank."""
    from megatron.core import parallel_state as ps

    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    pp = ps.get_pipeline_model_parallel_world_size()
    if pp == 1:
        for gname, t in _stage_params(built):
            if dist.get_rank() == 0:
                yield gname, cast(t)
        return
    in_rank0_pipeline = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    group, my_stage = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_rank()
    for stage in range(pp):
        src = dist.get_global_rank(group, stage)
        if my_stage == stage:
            for gname, t in _stage_params(built):
                if in_rank0_pipeline and stage > 0:
                    dist.broadcast_object_list([(gname, tuple(t.shape), t.dtype)], src=src, group=group)
                    dist.broadcast(t.contiguous(), src=src, group=group)
                if dist.get_rank() == 0:
                    yield gname, cast(t)
            if in_rank0_pipeline and stage > 0:
                dist.broadcast_object_list([None], src=src, group=group)  # end of this stage
        elif in_rank0_pipeline and stage > 0:
            yield from _receive_stage(src, group, cast)


def _receive_stage(src: int, group: Any, cast: Any) -> Iterator[tuple[str, torch.Tensor]]:
    while True:
        meta: list[Any] = [None]
        dist.broadcast_object_list(meta, src=src, group=group)
        if meta[0] is None:
            return
        gname, shape, dtype = meta[0]
        t = torch.empty(shape, dtype=dtype, device=torch.cuda.current_device())
        dist.broadcast(t, src=src, group=group)
        if dist.get_rank() == 0:
            yield gname, cast(t)


@contextmanager
def grad_buffers_freed(chunks: list[Any], enabled: bool) -> Iterator[None]:
    """Release the DDP gradient buffers' memory for the block (``weight_broadcast_free_grad_buffers``)
    with megatron-core's ``offload_grad_buffers`` / ``restore_grad_buffers`` (storage resized to 0,
    views kept; zeroed on restore). Gradients are not needed between steps."""
    if not enabled:
        yield
        return
    for chunk in chunks:
        chunk.offload_grad_buffers()
    try:
        yield
    finally:
        for chunk in chunks:
            chunk.restore_grad_buffers()
