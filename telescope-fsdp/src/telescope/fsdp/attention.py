"""``packed_sdpa``: attention over packed rows that costs about sum(n_i^2), not L^2.

transformers' own ``sdpa`` path keeps packed samples apart with a dense block-diagonal
[L, L] mask, so every row pays full L^2 attention whatever its samples' lengths, and the
masked kernel is slower than the causal one. This implementation splits the row at the
samples' boundaries (where ``position_ids`` restart) and runs causal
``scaled_dot_product_attention`` without a mask tensor. It is what ``attn_implementation:
auto`` picks when flash-attn is missing (CPU, and CUDA without flash-attn).

How the samples are grouped into SDPA calls (``plan_groups``, the documented rule):

- a sample longer than ``GROUP_MAX_LEN`` tokens gets a call of its own (its attention work
  dwarfs the per-call overhead, and padding it would add real work);
- shorter samples are grouped by length class (``ceil(log2(n))``: 1, 2, 3-4, 5-8, ...) and each
  class runs as **one** batched call, right-padded to its longest sample (at most 2x its
  shortest), so a row of 32 short RL answers costs a handful of kernels and autograd nodes
  instead of 32 per layer.

Right padding under a causal mask is exact: a real query at position i < n only sees keys
0..i, all real, and the padded queries' outputs are dropped (so no gradient reaches them).

Shared prefixes (``telescope.core.packing.share_prefixes``): a segment whose positions start at
``s > 0`` continues an earlier sequence of the row: its first ``s`` tokens are not in the row
again, they are the tokens at positions ``0..s-1`` found walking back over the preceding
segments (``segment_contexts``; each earlier segment supplies the positions it holds below what
is still needed). Its call row is then those context tokens followed by its own, so it attends
to exactly the keys of its whole sequence; only its own tokens' outputs are kept (the context
tokens' outputs come from their own segment). Rows packed without sharing start every segment
at 0 and get the plain layout above.
``per_sample_attention`` (one call per sample, the previous implementation) is kept as the
reference the grouped path is tested against.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "GROUP_MAX_LEN",
    "PACKED_SDPA",
    "AttentionPlan",
    "flash_attn_problem",
    "flash_varlen_kwargs",
    "uses_flash_attention",
    "grouped_attention",
    "packed_sdpa_attention",
    "per_sample_attention",
    "plan_attention",
    "plan_groups",
    "register_packed_sdpa",
    "segment_contexts",
    "segment_lengths",
]

PACKED_SDPA = "telescope_packed_sdpa"

log = logging.getLogger("telescope.fsdp")

#: Samples up to this many tokens share batched SDPA calls; longer ones get their own call.
GROUP_MAX_LEN = 256


def segment_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the runs of consecutive positions in a 1-D ``position_ids`` (one per sample)."""
    breaks = torch.nonzero(position_ids[1:] - position_ids[:-1] != 1).flatten() + 1
    edges = [0, *breaks.tolist(), position_ids.numel()]
    return [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]


def segment_contexts(position_ids: torch.Tensor) -> tuple[list[int], list[list[tuple[int, int]]]]:
    """Segment lengths and, per segment, its context: ``(row start, length)`` ranges holding the
    positions ``0..s-1`` before its first position ``s`` (empty for a segment starting at 0).

    The context is found walking back from the previous segment: a segment starting at position
    ``t`` holds positions ``t..``; it supplies those below what is still needed, and the walk goes
    on below ``t``. A segment whose walk runs out of segments, or meets a gap in the positions,
    keeps an empty context (attends to itself only, as a segment starting at 0 does).
    """
    pos = position_ids.reshape(-1).tolist()
    lengths = segment_lengths(position_ids.reshape(-1))
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    first = [pos[r] for r in starts]
    contexts: list[list[tuple[int, int]]] = []
    for i in range(len(lengths)):
        need, ranges, j = first[i], [], i - 1
        while need > 0 and j >= 0:
            if first[j] < need:
                if first[j] + lengths[j] < need:  # a gap: not a layout share_prefixes writes
                    break
                ranges.append((starts[j], need - first[j]))
                need = first[j]
            j -= 1
        contexts.append(ranges[::-1] if need == 0 else [])
    return lengths, contexts


def plan_groups(lengths: list[int], group_max_len: int = GROUP_MAX_LEN) -> list[list[int]]:
    """Segment indices per SDPA call: long segments alone, short ones by ``ceil(log2(n))`` class."""
    groups: list[list[int]] = []
    classes: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n > group_max_len:
            groups.append([i])
        else:
            classes.setdefault((n - 1).bit_length(), []).append(i)
    return groups + [classes[c] for c in sorted(classes)]


@dataclass(frozen=True)
class AttentionPlan:
    """Gather indices for each batched call and the inverse map back to row order."""

    gathers: list[torch.Tensor | slice]
    """Per call: ``[B, m]`` row positions (right-padded by repeating a sample's last position),
    or a ``slice`` of the row for a sample alone (a view: no copy)."""
    inverse: torch.Tensor | None
    """``[L]``: where each row token's output sits in the concatenated, flattened call outputs;
    None when the calls' outputs already are in row order (every sample alone)."""


def plan_attention(
    lengths: list[int],
    device: torch.device,
    group_max_len: int = GROUP_MAX_LEN,
    contexts: list[list[tuple[int, int]]] | None = None,
) -> AttentionPlan:
    """Index tensors for ``grouped_attention`` over segments of ``lengths`` (in row order), each
    preceded by its ``contexts`` ranges (``segment_contexts``; none by default)."""
    contexts = contexts or [[] for _ in lengths]
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    shared = [sum(n for _, n in ranges) for ranges in contexts]
    spans = [c + n for c, n in zip(shared, lengths, strict=True)]
    groups = plan_groups(spans, group_max_len)
    alone = all(len(g) == 1 for g in groups) and [g[0] for g in groups] == list(range(len(lengths)))
    if alone and not any(shared):
        return AttentionPlan([slice(s, s + n) for s, n in zip(starts, lengths, strict=True)], None)
    gathers: list[torch.Tensor | slice] = []
    inverse, offset = [0] * sum(lengths), 0
    for group in groups:
        m = max(spans[i] for i in group)
        if len(group) == 1 and not shared[group[0]]:
            s = starts[group[0]]
            gathers.append(slice(s, s + m))
            inverse[s : s + m] = range(offset, offset + m)
            offset += m
            continue
        rows = []
        for b, i in enumerate(group):
            n, s, c = lengths[i], starts[i], shared[i]
            cols = [r for start, k in contexts[i] for r in range(start, start + k)] + list(range(s, s + n))
            rows.append(cols + [cols[-1]] * (m - len(cols)))
            for j in range(n):
                inverse[s + j] = offset + b * m + c + j
        gathers.append(torch.tensor(rows, dtype=torch.long, device=device))
        offset += len(group) * m
    return AttentionPlan(gathers, torch.tensor(inverse, dtype=torch.long, device=device))


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: AttentionPlan,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Causal attention of q [1, H, L, D], k/v [1, Hkv, L, D] per ``plan`` -> [1, L, H, D]."""
    gqa = key.shape[1] != query.shape[1]
    q0, k0, v0 = query[0], key[0], value[0]
    outs = []
    for idx in plan.gathers:
        if isinstance(idx, slice):  # a sample alone: [1, H, n, D] views of the row
            qb, kb, vb = (t[None, :, idx] for t in (q0, k0, v0))
        else:  # [H, B, m, D] -> [B, H, m, D]: one batch entry per sample of the call
            flat_idx = idx.reshape(-1)
            qb, kb, vb = (
                t.index_select(1, flat_idx).unflatten(1, idx.shape).transpose(0, 1) for t in (q0, k0, v0)
            )
        out = F.scaled_dot_product_attention(
            qb, kb, vb, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        outs.append(out.transpose(1, 2).reshape(-1, q0.shape[0], q0.shape[2]))  # [B*m, H, D]
    flat = outs[0] if len(outs) == 1 else torch.cat(outs)
    return (flat if plan.inverse is None else flat.index_select(0, plan.inverse)).unsqueeze(0)


def per_sample_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    lengths: list[int],
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Reference path: one causal SDPA call per segment -> [1, L, H, D]."""
    gqa = key.shape[1] != query.shape[1]
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, sl],
                key[:, :, sl],
                value[:, :, sl],
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
        start += n
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


class _PlanCache:
    """The plan of the last ``position_ids`` seen: every layer of one forward gets the same tensor."""

    def __init__(self) -> None:
        self._key: tuple[Any, int, int] | None = None
        self._plan: AttentionPlan | None = None

    def get(self, position_ids: torch.Tensor) -> AttentionPlan:
        key = (position_ids, position_ids._version, position_ids.data_ptr())
        if self._plan is None or self._key is None or self._key[0] is not key[0] or self._key[1:] != key[1:]:
            lengths, contexts = segment_contexts(position_ids)
            # GROUP_MAX_LEN is read per call (benches set it)
            self._plan = plan_attention(lengths, position_ids.device, GROUP_MAX_LEN, contexts)
            self._key = key
        return self._plan


_plans = _PlanCache()


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
    p = dropout if module.training else 0.0
    return grouped_attention(query, key, value, _plans.get(position_ids), p, scaling), None


def register_packed_sdpa() -> str:
    """Register ``packed_sdpa`` with transformers (idempotent); returns its implementation name.

    It is deliberately not registered as a mask function, so transformers builds no mask.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    return PACKED_SDPA


def flash_attn_problem() -> str | None:
    """Why flash-attn cannot be used here, or None. It is imported, not only found: a wheel built for
    another torch (or CUDA) is found but fails on import (undefined symbols), which would otherwise
    crash the first forward pass."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (docs/gpu.md: MAX_JOBS=8 pip install --no-build-isolation flash-attn)"
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken binary raises ImportError (undefined symbol), OSError, ...
        return (
            f"flash-attn is installed but does not import ({type(exc).__name__}: {exc}); it was probably built "
            f"for another torch than {torch.__version__}: reinstall it with --no-build-isolation against this torch"
        )
    return None


def flash_varlen_kwargs(position_ids: torch.Tensor) -> dict[str, Any]:
    """transformers' flash-attention varlen kwargs for one packed row, computed once per micro-batch.

    Without them transformers derives the same boundaries from ``position_ids`` in every layer (a
    ``nonzero`` and a ``max().item()``: two device syncs per layer). Samples start where positions
    stop counting up by one (``segment_lengths``, as ``packed_sdpa`` splits the row).
    """
    lengths = segment_lengths(position_ids.reshape(-1))
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=position_ids.device)
    longest = max(lengths)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def uses_flash_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a transformers model) runs a flash-attention implementation."""
    config = getattr(model, "config", None)
    return "flash" in str(getattr(config, "_attn_implementation", None) or "")
