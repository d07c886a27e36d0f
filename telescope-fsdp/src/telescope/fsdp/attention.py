"""``packed_sdpa``: attention over packed rows that costs sum(n_i^2), not L^2.

transformers' own ``sdpa`` path keeps packed samples apart with a dense block-diagonal
[L, L] mask, so every row pays full L^2 attention whatever its samples' lengths, and the
masked kernel is slower than the causal one. This implementation splits the row at the
samples' boundaries (where ``position_ids`` restart) and runs causal
``scaled_dot_product_attention`` on each sample: exact, no mask tensor, and the work of a
varlen kernel. It is what ``attn_implementation: auto`` picks when flash-attn is missing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["PACKED_SDPA", "packed_sdpa_attention", "register_packed_sdpa", "segment_lengths"]

PACKED_SDPA = "telescope_packed_sdpa"


def segment_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the runs of consecutive positions in a 1-D ``position_ids`` (one per sample)."""
    breaks = torch.nonzero(position_ids[1:] - position_ids[:-1] != 1).flatten() + 1
    edges = [0, *breaks.tolist(), position_ids.numel()]
    return [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: q [1, H, L, D], k/v [1, Hkv, L, D] -> [1, L, H, D]."""
    position_ids = kwargs.get("position_ids")
    if query.shape[0] != 1 or position_ids is None or attention_mask is not None:
        raise ValueError(
            "packed_sdpa attention takes one packed row with position_ids and attention_mask=None; "
            f"got batch {query.shape[0]}, position_ids {'missing' if position_ids is None else 'given'}, "
            f"attention_mask {'given' if attention_mask is not None else 'None'}. Use attn_implementation 'sdpa' "
            "for padded batches"
        )
    if sliding_window is not None:
        raise NotImplementedError(
            "packed_sdpa attention does not implement sliding-window layers; use 'sdpa'"
        )
    gqa = key.shape[1] != query.shape[1]
    outs, start = [], 0
    for n in segment_lengths(position_ids.reshape(-1)):
        sl = slice(start, start + n)
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, sl],
                key[:, :, sl],
                value[:, :, sl],
                dropout_p=dropout if module.training else 0.0,
                is_causal=True,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
        start += n
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def register_packed_sdpa() -> str:
    """Register ``packed_sdpa`` with transformers (idempotent); returns its implementation name.

    It is deliberately not registered as a mask function, so transformers builds no mask.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    return PACKED_SDPA
