"""Backend-specific options of the ``megatron`` trainer backend (a light module: pydantic only).

Everything in the seed table (``megatron_*`` fields, learning rate, dtypes) comes from the run
config; these are the few knobs only this implementation has.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MegatronBackendKwargs"]


class MegatronBackendKwargs(BaseModel):
    """Options of the Megatron-Core trainer backend."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    adam_beta1: float = Field(default=0.9, gt=0, lt=1)
    """Adam beta1 (same default as the FSDP backend, so the two backends train alike)."""
    adam_beta2: float = Field(default=0.999, gt=0, lt=1)
    """Adam beta2 (FSDP's 0.999; the anchor used 0.98 for Megatron only, which made the backends differ)."""
    adam_eps: float = Field(default=1e-8, gt=0)
    """Adam epsilon."""
    vocab_divisible_by: int = Field(default=128, ge=1)
    """The embedding and output rows are padded to a multiple of ``vocab_divisible_by * TP``
    (Megatron's ``make_vocab_size_divisible_by``); the padding is dropped when exporting."""
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] = "delayed"
    """TransformerEngine FP8 scaling recipe when ``megatron_fp8`` is on (``mxfp8`` needs Blackwell)."""
    checkpoint_hf_weights: bool = True
    """Also write HF safetensors (``hf/`` in the checkpoint) so ``telescope checkpoint convert`` is a
    copy; costs one full weight gather and the weights' size on disk per checkpoint."""
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = "auto"
    """Megatron ``attention_backend``; packed rows need a TE backend (``auto``/``flash``/``fused``),
    the local spec uses a dense per-row segment mask instead (O(L^2) memory)."""
