"""Core's packed rows -> Megatron packed-sequence boundaries (hand-computed expectations)."""

from __future__ import annotations

from telescope.core.packing import MicroBatch, pack_samples
from telescope.core.trainer import TrainSample
from telescope.megatron.packed import packed_boundaries, pad_row, split_segments


def _sample(n_prompt: int, n_completion: int, start: int = 1) -> TrainSample:
    ids = list(range(start, start + n_prompt + n_completion))
    return TrainSample(ids[:n_prompt], ids[n_prompt:], [-0.5] * n_completion, advantage=1.0)


def _row() -> MicroBatch:
    # Samples of 5 and 3 tokens in one row of seq_len 16; 8 real tokens padded to a multiple of 6.
    packed = pack_samples([_sample(2, 3), _sample(1, 2, start=50)], seq_len=16, pad_to_multiple_of=6)
    (row,) = packed.per_rank[0]
    return row


def test_boundaries_of_two_samples_and_padding() -> None:
    row = _row()
    # FFD puts the 5-token sample first, then the 3-token one; 8 tokens padded to 12.
    assert row.sample_index == [0] * 5 + [1] * 3 + [-1] * 4
    b = packed_boundaries(row)
    assert b.cu_seqlens == [0, 5, 8, 12]
    assert b.cu_seqlens_padded == [0, 5, 8, 12]
    assert b.max_seqlen == 5
    assert b.num_segments == 3
    assert b.segment_ids == [0] * 5 + [1] * 3 + [2] * 4


def test_padded_boundaries_round_each_segment() -> None:
    b = packed_boundaries(_row(), segment_pad_multiple=4)
    assert b.cu_seqlens == [0, 5, 8, 12]
    assert b.cu_seqlens_padded == [0, 8, 12, 16]  # 5->8, 3->4, 4->4
    assert b.max_seqlen == 8


def test_row_without_padding_has_no_padding_segment() -> None:
    packed = pack_samples([_sample(2, 2), _sample(2, 2, start=9)], seq_len=8, pad_to_multiple_of=8)
    b = packed_boundaries(packed.per_rank[0][0])
    assert b.cu_seqlens == [0, 4, 8]


def test_split_segments_one_row_per_sample() -> None:
    row = _row()
    parts = split_segments(row)
    assert [p.input_ids for p in parts] == [[1, 2, 3, 4, 5], [50, 51, 52]]
    assert [p.position_ids for p in parts] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert [p.loss_mask for p in parts] == [[0, 0, 1, 1, 1], [0, 1, 1]]
    assert [p.inference_logprobs for p in parts] == [[0.0, 0.0, -0.5, -0.5, -0.5], [0.0, -0.5, -0.5]]
    assert all(p.num_samples == 1 and p.num_real_tokens == p.length for p in parts)
    # every trained token of the packed row (shifted targets) is trained in exactly one part
    assert sum(row.loss_mask[1:]) == sum(sum(p.loss_mask[1:]) for p in parts)


def test_pad_row_extends_padding_segment() -> None:
    row = _row()
    padded = pad_row(row, 16)
    assert padded.length == 16
    assert padded.sample_index == row.sample_index + [-1] * 4
    assert padded.position_ids[-8:] == list(range(8))  # padding segment continues 0..7
    assert padded.loss_mask[12:] == [0, 0, 0, 0] and padded.num_real_tokens == row.num_real_tokens
    assert packed_boundaries(padded).cu_seqlens == [0, 5, 8, 16]
    assert pad_row(row, 4) is row


def test_pad_row_starts_padding_when_row_is_full() -> None:
    packed = pack_samples([_sample(2, 2)], seq_len=8, pad_to_multiple_of=4)
    row = packed.per_rank[0][0]
    padded = pad_row(row, 6)
    assert padded.sample_index == [0] * 4 + [-1] * 2
    assert padded.position_ids == [0, 1, 2, 3, 0, 1]
