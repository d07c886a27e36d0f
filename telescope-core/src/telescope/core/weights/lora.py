"""LoRA adapters (``peft``) shared by the trainer and the transformers engine: one config, one naming.

``lora_rank > 0`` makes LoRA a mode of the trainer: ``peft`` injects the adapters into the
Hugging Face model in place (``inject_adapter_in_model``: the model keeps its class, so sharding,
packing and the engine's decode loop are unchanged), the base weights are frozen, and only the
adapter tensors are optimised, checkpointed and synced.

On the wire and in exported adapters, tensors carry PEFT's file names (what
``PeftModel.save_pretrained`` writes and vLLM's LoRA loader reads):
``base_model.model.<module path>.lora_A.weight``; inside a model they are
``<module path>.lora_A.default.weight``. ``peft`` is imported lazily (core stays light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = [
    "ADAPTER_NAME",
    "adapter_parameters",
    "inject_lora",
    "is_adapter_name",
    "lora_config",
    "lora_config_dict",
    "model_name",
    "wire_name",
]

ADAPTER_NAME = "default"
_PEFT_PREFIX = "base_model.model."
_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


def lora_config_dict(cfg: TelescopeConfig) -> dict[str, Any]:
    """The run's adapter settings as ``peft.LoraConfig`` keyword arguments.

    ``lora_target_modules: null`` is peft's ``all-linear``: every linear layer of the decoder
    (attention and MLP projections), never the output head.
    """
    targets = list(cfg.lora_target_modules) if cfg.lora_target_modules is not None else "all-linear"
    return {
        "r": int(cfg.lora_rank),
        "lora_alpha": float(cfg.lora_alpha),
        "lora_dropout": float(cfg.lora_dropout),
        "target_modules": targets,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def lora_config(cfg: TelescopeConfig) -> Any:
    """``peft.LoraConfig`` of the run (``lora_rank`` must be > 0)."""
    from peft import LoraConfig

    if cfg.lora_rank <= 0:
        raise ValueError(f"lora_rank is {cfg.lora_rank}: LoRA adapters need lora_rank > 0")
    return LoraConfig(**lora_config_dict(cfg))


def inject_lora(model: Any, cfg: TelescopeConfig) -> Any:
    """Inject the run's adapters into ``model`` in place and freeze everything else; returns ``model``.

    Fails naming ``lora_target_modules`` when none of its names matches a module of the model.
    """
    from peft import inject_adapter_in_model

    try:
        inject_adapter_in_model(lora_config(cfg), model, adapter_name=ADAPTER_NAME)
    except ValueError as exc:
        if "not found in the base model" not in str(exc) and "Target modules" not in str(exc):
            raise
        raise ValueError(
            f"lora_target_modules: {cfg.lora_target_modules!r} matches no module of {cfg.model!r} ({exc}); "
            "name its linear layers (e.g. [q_proj, v_proj]) or set null for all of them"
        ) from exc
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_name(name))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"lora_rank {cfg.lora_rank}: peft injected no adapter into {cfg.model!r}")
    return model


def is_adapter_name(name: str) -> bool:
    """Whether a parameter name (model or wire form) is an adapter tensor."""
    return any(marker in name for marker in _MARKERS)


def wire_name(name: str) -> str:
    """``model.layers.0.q_proj.lora_A.default.weight`` -> ``base_model.model.model.layers.0.q_proj.lora_A.weight``."""
    if f".{ADAPTER_NAME}." in name:
        name = name.replace(f".{ADAPTER_NAME}.", ".", 1)
    else:
        name = name.removesuffix(f".{ADAPTER_NAME}")
    return _PEFT_PREFIX + name


def model_name(wire: str) -> str:
    """Inverse of ``wire_name``."""
    name = wire.removeprefix(_PEFT_PREFIX)
    for marker in _MARKERS:
        if marker in name:
            head, tail = name.split(marker, 1)
            return f"{head}{marker}{ADAPTER_NAME}.{tail}"
    raise ValueError(f"{wire!r} is not a LoRA adapter tensor name")


def adapter_parameters(model: Any) -> dict[str, Any]:
    """``{wire name: parameter}`` of every adapter tensor of ``model``, in module order."""
    return {wire_name(n): p for n, p in model.named_parameters() if is_adapter_name(n)}
