"""Core's packed rows (``MicroBatch``) in Megatron's packed-sequence ("thd") format.

A packed row holds several samples back to back, then padding. Megatron's TE attention keeps
them apart with cumulative sequence boundaries (``cu_seqlens``, as in
``megatron.core.packed_seq_params.PackedSeqParams``); the local (non-TE) spec cannot take
them, so its rows are split into one micro-batch per sample (``split_segments``). Segments are the runs of equal
``MicroBatch.sample_index``; the trailing padding (index -1) is its own segment, so the
boundaries always cover the whole row (TE requires ``cu_seqlens[-1]`` = tokens in the tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.packing import MicroBatch

__all__ = ["PackedBoundaries", "pad_row", "packed_boundaries", "split_segments", "to_packed_seq_params"]


@dataclass(frozen=True)
class PackedBoundaries:
    """Segment boundaries of one packed row."""

    cu_seqlens: list[int]
    """``[0, end_1, ..., end_n]``: cumulative segment lengths (real samples, then padding)."""
    cu_seqlens_padded: list[int]
    """The same with each segment rounded up to the pad multiple (equals ``cu_seqlens`` when 1)."""
    max_seqlen: int
    """Longest segment (padded), the ``max_seqlen_q/kv`` TE needs."""
    segment_ids: list[int]
    """Per token: the segment it belongs to (0-based)."""

    @property
    def num_segments(self) -> int:
        """Segments in the row (samples, plus one when the row has padding)."""
        return len(self.cu_seqlens) - 1


def packed_boundaries(mb: MicroBatch, segment_pad_multiple: int = 1) -> PackedBoundaries:
    """Boundaries of ``mb``'s samples and padding.

    ``segment_pad_multiple`` > 1 (2 x CP for context parallel) also gives the per-segment
    padded offsets TE uses to locate each sample in a re-laid-out row (``cu_seqlens_padded``).
    """
    if segment_pad_multiple < 1:
        raise ValueError(f"segment_pad_multiple must be >= 1, got {segment_pad_multiple}")
    lengths: list[int] = []
    segment_ids: list[int] = []
    previous: int | None = None
    for sample in mb.sample_index:
        if sample != previous:
            lengths.append(0)
            previous = sample
        lengths[-1] += 1
        segment_ids.append(len(lengths) - 1)
    cu, cu_padded = [0], [0]
    for n in lengths:
        cu.append(cu[-1] + n)
        cu_padded.append(cu_padded[-1] + -(-n // segment_pad_multiple) * segment_pad_multiple)
    padded_lengths = [b - a for a, b in zip(cu_padded, cu_padded[1:], strict=False)]
    return PackedBoundaries(cu, cu_padded, max(padded_lengths, default=0), segment_ids)


def to_packed_seq_params(bounds: PackedBoundaries, device: Any) -> Any:
    """Megatron ``PackedSeqParams(qkv_format="thd", ...)`` for one row (needs megatron-core).

    Never run: only the TE spec uses it, and TE needs CUDA.
    """
    import torch

    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor(bounds.cu_seqlens, dtype=torch.int32, device=device)
    cu_padded = torch.tensor(bounds.cu_seqlens_padded, dtype=torch.int32, device=device)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=bounds.max_seqlen,
        max_seqlen_kv=bounds.max_seqlen,
    )


def split_segments(mb: MicroBatch) -> list[MicroBatch]:
    """One row per real sample of ``mb`` (padding dropped), for the local (non-TE) layer spec.

    The local spec's attention takes no ``PackedSeqParams`` and its RoPE numbers positions
    0..L-1 over the whole input, so packed samples are run one per micro-batch instead: plain
    causal attention and correct positions, no O(L^2) segment mask. Loss-wise nothing changes:
    the token that crossed a sample boundary in the packed row is a prompt token (never trained).
    """
    from dataclasses import replace

    out: list[MicroBatch] = []
    bounds = packed_boundaries(mb)
    for a, b in zip(bounds.cu_seqlens, bounds.cu_seqlens[1:], strict=False):
        if mb.sample_index[a] == -1:
            continue
        out.append(
            replace(
                mb,
                input_ids=mb.input_ids[a:b],
                position_ids=mb.position_ids[a:b],
                loss_mask=mb.loss_mask[a:b],
                inference_logprobs=mb.inference_logprobs[a:b],
                advantages=mb.advantages[a:b],
                sample_index=mb.sample_index[a:b],
                num_samples=1,
                num_real_tokens=b - a,
            )
        )
    return out


def pad_row(mb: MicroBatch, multiple: int) -> MicroBatch:
    """``mb`` with more padding so its length is a multiple of ``multiple`` (sequence parallel
    scatters the row over TP ranks, FP8 GEMMs want multiples of 16). Returns ``mb`` itself when
    no padding is needed; the extra tokens continue the padding segment (or start one)."""
    from dataclasses import replace

    extra = -mb.length % multiple
    if extra == 0:
        return mb
    last_is_pad = bool(mb.sample_index) and mb.sample_index[-1] == -1
    start = mb.position_ids[-1] + 1 if last_is_pad else 0
    pad_id = mb.input_ids[-1] if last_is_pad else 0
    return replace(
        mb,
        input_ids=mb.input_ids + [pad_id] * extra,
        position_ids=mb.position_ids + list(range(start, start + extra)),
        loss_mask=mb.loss_mask + [0] * extra,
        inference_logprobs=mb.inference_logprobs + [0.0] * extra,
        advantages=mb.advantages + [0.0] * extra,
        sample_index=mb.sample_index + [-1] * extra,
    )
