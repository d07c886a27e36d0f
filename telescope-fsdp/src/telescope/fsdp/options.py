"""Backend-specific options of the ``fsdp`` trainer backend (a light module: pydantic only).

Everything shared with other backends (learning rate, dtypes, schedules, ...) comes from the
run config; these are the knobs only FSDP2 has.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["FSDPBackendKwargs"]


class FSDPBackendKwargs(BaseModel):
    """Options of the FSDP2 trainer backend."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: ``auto`` picks CUDA when available (NCCL), else CPU (gloo)."""
    attn_implementation: Literal["auto", "flash_attention_2", "packed_sdpa", "sdpa", "eager"] = "auto"
    """Attention kernel: ``auto`` = flash_attention_2 on CUDA when flash-attn is installed, else
    ``packed_sdpa`` (causal SDPA without a mask, short samples batched by length class and long
    ones alone: about sum(n_i^2) work, runs on CPU; see ``telescope.fsdp.attention``). ``sdpa`` and
    ``eager`` are transformers' own, with a dense block-diagonal [L, L] mask (L^2 work). All of
    them keep packed samples apart (position_ids restart, attention_mask=None, no KV cache)."""
    gradient_checkpointing: bool | None = None
    """Recompute decoder-layer activations in the backward pass (less memory, ~30% more compute).
    None = on when training on CUDA (GPU memory is the limit), off on CPU (the small models
    trained there fit in host memory, and recomputing costs a third of the backward time)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """``adamw`` (betas 0.9/0.999, eps 1e-8, the run's weight_decay) or plain ``sgd`` (no momentum;
    used by equality tests, where AdamW's first step amplifies reduction-order noise)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after each layer's forward (FSDP2 default for non-root modules);
    ``false`` keeps them until backward (more memory, fewer all-gathers)."""
    sync_gradients_every_micro_batch: bool = True
    """Reduce-scatter gradients after every micro-batch (sharded gradient memory). ``false``
    reduces only after a minibatch's last micro-batch: fewer collectives, but every rank holds
    unsharded gradients for the whole model in between."""
    share_prompt_prefixes: bool = True
    """With ``packed_sdpa`` attention: write the prompt tokens that samples of one packed row share
    (a GRPO group's prompt, a common system prompt) once, not once per sample
    (``telescope.core.packing.share_prefixes``). The loss and gradients are the same; the
    shared tokens' forward and backward are done once. Other attention implementations cannot
    read such rows and always get one full copy per sample."""
