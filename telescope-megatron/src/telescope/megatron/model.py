"""Megatron GPTModel built from a Hugging Face checkpoint (GPU path).

Run so far only on CPU with real megatron-core 0.19.2 (test-only CUDA shims,
tests/megatron/test_megatron_core_cpu.py): local spec, fp32, all five architectures, TP 2, PP 2,
EP 2 - logits equal HF's. Never run: CUDA, the TE spec, bf16 (Float16Module), FP8; the ``gpu``
tests in tests/megatron/test_gpu.py cover those.

Weights: read tensor by tensor from the checkpoint's safetensors files (``mapping.source``; a rank
reads only what it holds), else the HF model is loaded on CPU with ``from_pretrained`` (so hub ids, local paths and
transformers' own checkpoint conversions all work), converted with ``telescope.megatron.mapping``
and each rank copies in its own TP shard / pipeline layers / experts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from telescope.megatron.mapping import ModelSpec, model_spec_from_hf_config
from telescope.megatron.mapping.placement import global_name
from telescope.megatron.mapping.source import MegatronFromHF, open_hf_checkpoint
from telescope.megatron.mapping.tp import expert_index, shard_tensor, tp_partition
from telescope.megatron.options import MegatronBackendKwargs
from telescope.megatron.parallel import ParallelLayout
from telescope.megatron.settings import ddp_config_kwargs, gpt_model_kwargs, transformer_config_kwargs

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["BuiltModel", "build_model", "gpt_with_hf_weights", "rank_offsets"]

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class BuiltModel:
    """The wrapped model chunk plus what weight export and checkpoints need."""

    chunks: list[Any]
    """DDP-wrapped model chunks (one: no virtual pipeline stages)."""
    gpt: Any
    """The bare ``GPTModel`` inside the wrappers (local parameter names)."""
    config: Any
    """Megatron ``TransformerConfig``."""
    spec: ModelSpec
    hf_config: Any
    padded_vocab: int


def attn_backend(name: str, enum_cls: Any = None) -> Any:
    """Megatron's ``AttnBackend`` member for ``name``. ``TransformerConfig`` compares
    ``attention_backend`` with the enum's members, so a string silently selects nothing."""
    if enum_cls is None:
        from megatron.core.transformer.enums import AttnBackend

        enum_cls = AttnBackend
    try:
        return enum_cls[name]
    except KeyError:
        known = ", ".join(m.name for m in enum_cls)
        raise ValueError(
            f"attention_backend: {name!r} is not one of Megatron's AttnBackend ({known})"
        ) from None


def materialize(kw: dict[str, Any], attn_backend_enum: Any = None) -> dict[str, Any]:
    """Strings in the torch-free settings dicts -> the objects Megatron expects (dtypes, the
    activation function, the ``AttnBackend`` enum)."""
    out = dict(kw)
    if out.get("activation_func") == "silu":
        out["activation_func"] = torch.nn.functional.silu
    if isinstance(out.get("attention_backend"), str):
        out["attention_backend"] = attn_backend(out["attention_backend"], attn_backend_enum)
    for key in (
        "params_dtype",
        "pipeline_dtype",
        "main_grads_dtype",
        "main_params_dtype",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
    ):
        if isinstance(out.get(key), str):
            out[key] = DTYPES[out[key]]
    return out


def _layer_spec(spec: ModelSpec, tc: Any, use_te: bool) -> Any:
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if spec.num_experts:  # per-layer dense/MoE choice follows config.moe_layer_freq
        return specs.get_gpt_decoder_block_spec(tc, use_transformer_engine=use_te)
    if use_te:
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm)
    return specs.get_gpt_layer_local_spec(qk_layernorm=spec.qk_norm, normalization="RMSNorm")


def rank_offsets(gpt: Any, spec: ModelSpec) -> tuple[int, int]:
    """(first global layer of this pipeline stage, first global expert of this EP rank)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    layer_offset = get_transformer_layer_offset(gpt.config)
    expert_offset = 0
    if spec.num_experts:
        expert_offset = ps.get_expert_model_parallel_rank() * (
            spec.num_experts // ps.get_expert_model_parallel_world_size()
        )
    return layer_offset, expert_offset


def build_model(
    cfg: TelescopeConfig, kwargs: MegatronBackendKwargs, layout: ParallelLayout, device: torch.device
) -> BuiltModel:
    """GPTModel for this rank with the HF weights loaded, in Float16Module and Megatron DDP."""
    from transformers import AutoConfig

    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    hf_config = AutoConfig.from_pretrained(cfg.model)
    spec = model_spec_from_hf_config(hf_config)
    use_te = bool(cfg.megatron_use_transformer_engine)
    tc = TransformerConfig(**materialize(transformer_config_kwargs(spec, cfg, layout, kwargs)))
    padded_vocab = spec.padded_vocab_size(kwargs.vocab_divisible_by, layout.tensor)
    gpt = gpt_with_hf_weights(spec, cfg, tc, use_te, padded_vocab)
    gpt.to(device)
    module = Float16Module(tc, gpt) if (tc.bf16 or tc.fp16) else gpt
    ddp = DistributedDataParallel(tc, DistributedDataParallelConfig(**ddp_config_kwargs(cfg)), module)
    _wire_grad_sync(tc, ddp, cfg)
    logger.info(
        "megatron model %s: TP=%d PP=%d EP=%d DP=%d",
        cfg.model,
        layout.tensor,
        layout.pipeline,
        layout.expert,
        layout.data,
    )
    return BuiltModel([ddp], gpt, tc, spec, hf_config, padded_vocab)


def _wire_grad_sync(tc: Any, ddp: Any, cfg: TelescopeConfig) -> None:
    """What Megatron's own training loop sets up: without ``finalize_model_grads_func`` the
    schedules never all-reduce gradients across data-parallel ranks."""
    from megatron.core.distributed import finalize_model_grads

    tc.finalize_model_grads_func = finalize_model_grads
    tc.no_sync_func = ddp.no_sync
    if cfg.megatron_overlap_grad_reduce:
        tc.grad_sync_func = ddp.start_grad_sync


@torch.no_grad()
def gpt_with_hf_weights(
    spec: ModelSpec, cfg: TelescopeConfig, tc: Any, use_te: bool, padded_vocab: int
) -> Any:
    """This pipeline stage's ``GPTModel`` holding the HF checkpoint ``cfg.model``'s weights."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    gpt = GPTModel(
        config=tc,
        transformer_layer_spec=_layer_spec(spec, tc, use_te),
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        **gpt_model_kwargs(spec, cfg, padded_vocab),
    )
    load_hf_weights(gpt, cfg, spec, use_te, padded_vocab)
    return gpt


def load_hf_weights(gpt: Any, cfg: TelescopeConfig, spec: ModelSpec, use_te: bool, padded_vocab: int) -> None:
    """Copy this rank's part of the HF checkpoint into ``gpt`` (every local parameter is set)."""
    from transformers import AutoModelForCausalLM

    from megatron.core import parallel_state as ps

    checkpoint = open_hf_checkpoint(cfg.model)
    full = (
        None
        if checkpoint is None
        else MegatronFromHF(checkpoint, spec, te_spec=use_te, padded_vocab=padded_vocab)
    )
    if full is None or full.missing():  # nothing to read lazily: the whole model, once, on this rank
        why = "no local safetensors checkpoint" if full is None else f"its files lack {full.missing()[:3]}"
        logger.warning("%s: %s; loading the whole model on every rank with from_pretrained", cfg.model, why)
        state = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).state_dict()
        full = MegatronFromHF(state, spec, te_spec=use_te, padded_vocab=padded_vocab)
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    etp, etp_rank = ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_rank()
    layer_offset, expert_offset = rank_offsets(gpt, spec)
    for name, param in gpt.named_parameters():
        gname = global_name(name, layer_offset, expert_offset)
        if gname == "output_layer.weight" and spec.tie_word_embeddings:
            gname = "embedding.word_embeddings.weight"  # the last stage's copy of the shared embedding
        if gname not in full:
            raise KeyError(f"Megatron parameter {name} (global {gname}) has no HF source tensor")
        is_expert = expert_index(gname) is not None
        shard = shard_tensor(
            full.get(gname), tp_partition(gname), etp if is_expert else tp, etp_rank if is_expert else tp_rank
        )
        if shard.shape != param.shape:
            raise ValueError(
                f"{name}: converted shard {tuple(shard.shape)} != parameter {tuple(param.shape)}"
            )
        param.copy_(shard.to(param.dtype))
