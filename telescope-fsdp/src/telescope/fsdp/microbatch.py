"""The packed forward pass of a Hugging Face model, turning packed micro-batches into logits.

The micro-batch tensors themselves are shared with the other backends
(``telescope.core.training.tensors``).
"""

from __future__ import annotations

import torch
from torch import nn

from telescope.core.training.tensors import DeviceMicroBatch
from telescope.fsdp.attention import flash_varlen_kwargs, uses_flash_attention

__all__ = ["packed_logits"]


def packed_logits(model: nn.Module, mb: DeviceMicroBatch) -> torch.Tensor:
    """Logits ``[L - 1, V]`` predicting ``mb.targets`` from one packed row.

    Packed samples are kept apart by the restarting ``position_ids``: transformers builds a
    block-diagonal causal mask (sdpa/eager) or varlen boundaries (flash) from them, but only
    with ``attention_mask=None`` and no KV cache, hence ``use_cache=False`` here. For flash
    attention the varlen boundaries are computed here, once per micro-batch, not in every layer.
    """
    varlen = flash_varlen_kwargs(mb.position_ids) if uses_flash_attention(model) else {}
    out = model(
        input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, use_cache=False, **varlen
    )
    return out.logits[0, :-1]
