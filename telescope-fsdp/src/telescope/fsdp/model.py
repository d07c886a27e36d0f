"""Model setup: load a Hugging Face causal LM and shard it with FSDP2 ``fully_shard``."""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from telescope.fsdp.attention import flash_attn_problem, register_packed_sdpa
from telescope.fsdp.options import FSDPBackendKwargs

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["DTYPES", "build_model", "pick_attn_implementation", "shard_model"]

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_attn_implementation(
    requested: str, device: torch.device, compute_dtype: torch.dtype = torch.bfloat16
) -> str:
    """transformers' ``attn_implementation`` name for the option (``auto``: flash-attn on CUDA
    when it imports and computing in 16 bits, else ``packed_sdpa``; a flash-attn that is found but
    does not import falls back with a warning saying why, or is refused when asked for by name)."""
    if requested == "auto":
        usable = device.type == "cuda" and compute_dtype in (torch.float16, torch.bfloat16)
        problem = flash_attn_problem() if usable else None
        if problem is not None and _flash_attn_found():
            logger.warning("attn_implementation auto: using packed_sdpa, not flash-attn: %s", problem)
        requested = "flash_attention_2" if usable and problem is None else "packed_sdpa"
    if requested == "flash_attention_2" and device.type != "cuda":
        raise ValueError("attn_implementation 'flash_attention_2' needs CUDA; use 'packed_sdpa' on CPU")
    if requested == "flash_attention_2" and (problem := flash_attn_problem()) is not None:
        raise ValueError(f"attn_implementation 'flash_attention_2': {problem}; or use 'packed_sdpa'")
    if requested == "packed_sdpa":
        return register_packed_sdpa()
    return requested


def _flash_attn_found() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def build_model(
    cfg: TelescopeConfig, kwargs: FSDPBackendKwargs, device: torch.device, mesh: Any
) -> nn.Module:
    """``from_pretrained(cfg.model)`` in ``cfg.model_dtype``, prepared for packed training, sharded.

    Only rank 0 reads the checkpoint; the other ranks build the model on the meta device and
    receive their shards from rank 0, so the full model is never materialised on every rank.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    compute_dtype = DTYPES[cfg.mixed_precision_dtype or cfg.model_dtype]
    attn = pick_attn_implementation(kwargs.attn_implementation, device, compute_dtype)
    dtype, rank, world_size = DTYPES[cfg.model_dtype], mesh.get_rank(), mesh.size()
    full_state: dict[str, Any] = {}
    if rank == 0:
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, attn_implementation=attn)
    else:
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(cfg.model)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    if cfg.lora_rank > 0:  # adapters on the frozen base model; rank 0's initial adapters reach every rank
        from telescope.core.weights.lora import inject_lora

        inject_lora(model, cfg)
    if rank == 0 and world_size > 1:
        full_state = model.state_dict()
    # Packed rows rely on restarting position_ids; a KV cache silently disables that detection.
    model.config.use_cache = False
    checkpointing = kwargs.gradient_checkpointing
    if checkpointing is None:
        checkpointing = device.type == "cuda"
    if checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    shard_model(model, cfg.mixed_precision_dtype, kwargs.reshard_after_forward, mesh)
    if world_size > 1:
        broadcast_weights_from_rank0(model, full_state, device, rank)
    logger.info(
        "loaded %s (%s, attention=%s, checkpointing=%s, lora_rank=%d) on %s",
        cfg.model,
        cfg.model_dtype,
        attn,
        checkpointing,
        cfg.lora_rank,
        device,
    )
    return model


def broadcast_weights_from_rank0(
    model: nn.Module, full_state: dict[str, Any], device: torch.device, rank: int
) -> None:
    """Fill every rank's shards from rank 0's full state dict, then copy rank 0's buffers
    (including non-persistent ones such as rotary ``inv_freq``, absent from state dicts)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if rank != 0:
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state, options=options)
    for _, buffer in model.named_buffers():
        dist.broadcast(buffer, src=0)


def enable_activation_checkpointing(model: Any) -> None:
    """Non-reentrant per-layer recompute (the only kind that composes with FSDP2)."""
    ac_kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=ac_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ac_kwargs)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Modules to shard one by one: those named in ``_no_split_modules``, else ``model.model.layers``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        inner = getattr(model, "model", None)
        layers = list(getattr(inner, "layers", []))
    if not layers:
        raise ValueError(
            f"cannot find decoder layers to shard in {type(model).__name__}: it declares no "
            "_no_split_modules and has no model.layers"
        )
    return layers


def shard_model(model: Any, mixed_precision_dtype: str | None, reshard: bool, mesh: Any) -> None:
    """``fully_shard`` each decoder layer, untied input embeddings, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if mixed_precision_dtype is not None:
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[mixed_precision_dtype], reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    embeddings = model.get_input_embeddings()
    if not tied and embeddings is not None:
        fully_shard(embeddings, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
