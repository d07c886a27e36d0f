"""Packing: first-fit-decreasing rows, padding, rank balance, over-long samples, efficiency."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from telescope.core.packing import Packer, first_fit_decreasing, pack_samples
from telescope.core.trainer import TrainSample


def sample(n_prompt: int, n_comp: int, adv: float = 1.0, base: int = 1) -> TrainSample:
    return TrainSample(
        prompt_ids=[base] * n_prompt,
        completion_ids=[base + 1] * n_comp,
        inference_logprobs=[-0.5] * n_comp,
        advantage=adv,
    )


def test_row_layout_by_hand() -> None:
    s0 = TrainSample([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], advantage=2.0, loss_mask=[1, 0, 1])
    s1 = TrainSample([3], [4], [-0.4], advantage=-1.0)
    packed = pack_samples([s0, s1], seq_len=16, pad_to_multiple_of=4)
    (row,) = packed.per_rank[0]
    # longest first (s0: 5 tokens, s1: 2 tokens), then padding to 8 forming its own segment
    assert row.input_ids == [5, 6, 7, 8, 9, 3, 4, 0]
    assert row.position_ids == [0, 1, 2, 3, 4, 0, 1, 0]
    assert row.loss_mask == [0, 0, 1, 0, 1, 0, 1, 0]
    assert row.inference_logprobs == [0.0, 0.0, -0.1, -0.2, -0.3, 0.0, -0.4, 0.0]
    assert row.advantages == [2.0] * 5 + [-1.0] * 2 + [0.0]
    assert row.sample_index == [0] * 5 + [1] * 2 + [-1]
    assert (row.num_samples, row.num_real_tokens, row.num_loss_tokens) == (2, 7, 3)
    assert packed.packing_efficiency == pytest.approx(7 / 8)


def test_first_fit_decreasing_known_case() -> None:
    lengths = [3, 6, 2, 5, 4]
    bins = first_fit_decreasing(list(range(5)), lengths, capacity=10)
    # sorted 6,5,4,3,2: 6->A, 5->B, 4->A(10), 3->B(8), 2->B(10)
    assert bins == [[1, 4], [3, 0, 2]]


@pytest.mark.parametrize("dp", [1, 2, 3])
def test_every_sample_once_rows_fit_and_ranks_equal(dp: int) -> None:
    prompts = [3, 9, 1, 4, 7, 2, 5, 8, 6, 2, 3, 1]
    completions = [20, 5, 40, 11, 3, 30, 9, 14, 2, 25, 7, 17]
    lengths = list(zip(prompts, completions, strict=True))
    samples = [sample(p, c, base=1 + i) for i, (p, c) in enumerate(lengths)]
    packed = pack_samples(samples, seq_len=48, pad_to_multiple_of=8, dp_world_size=dp)
    counts = {len(r) for r in packed.per_rank}
    assert len(packed.per_rank) == dp and len(counts) == 1
    seen = Counter(i for r in packed.per_rank for mb in r for i in set(mb.sample_index) if i >= 0)
    assert seen == Counter(range(len(samples)))
    for mb in (mb for r in packed.per_rank for mb in r):
        assert mb.num_real_tokens <= 48 and mb.length % 8 == 0 and mb.length - mb.num_real_tokens < 8
        # the tokens of each sample are contiguous and its positions count 0..n-1
        for i in set(mb.sample_index) - {-1}:
            pos = [p for p, j in zip(mb.position_ids, mb.sample_index, strict=True) if j == i]
            assert pos == list(range(sum(lengths[i])))
    total = sum(p + c for p, c in lengths)
    assert packed.num_real_tokens == total
    assert packed.packing_efficiency == pytest.approx(
        total / sum(mb.length for r in packed.per_rank for mb in r)
    )


def test_ranks_balanced_by_tokens() -> None:
    # 4 rows of 40, 30, 20, 10 tokens over 2 ranks: the balanced split is {40,10} / {30,20}
    samples = [sample(1, n - 1) for n in (40, 30, 20, 10)]
    packed = pack_samples(samples, seq_len=40, pad_to_multiple_of=1, dp_world_size=2)
    loads = sorted(sum(mb.num_real_tokens for mb in r) for r in packed.per_rank)
    assert loads == [50, 50]


def test_fewer_samples_than_ranks_gives_padding_rows() -> None:
    packed = pack_samples([sample(2, 3)], seq_len=32, pad_to_multiple_of=8, dp_world_size=2)
    rows = [r[0] for r in packed.per_rank]
    empty = [mb for mb in rows if mb.num_samples == 0]
    assert len(empty) == 1
    assert empty[0].length == 8 and empty[0].num_loss_tokens == 0 and set(empty[0].sample_index) == {-1}


def minibatch_samples(packed: object, k: int) -> set[int]:
    return {i for r in packed.per_rank for mb in r if mb.minibatch == k for i in mb.sample_index if i >= 0}


def test_minibatches_split_samples_independently_of_rank_count() -> None:
    samples = [sample(2, n) for n in (30, 4, 22, 9, 15, 12, 3)]  # lengths 32, 6, 24, 11, 17, 14, 5
    one = pack_samples(samples, seq_len=32, pad_to_multiple_of=8, dp_world_size=1, num_minibatches=2)
    two = pack_samples(samples, seq_len=32, pad_to_multiple_of=8, dp_world_size=2, num_minibatches=2)
    # longest first to the lighter minibatch: 32->A, 24->B, 17->B(41), 14->A(46), 11->B(52), 6->A(52), 5->A
    assert minibatch_samples(one, 0) == minibatch_samples(two, 0) == {0, 5, 1, 6}
    assert minibatch_samples(one, 1) == minibatch_samples(two, 1) == {2, 4, 3}
    for k in (0, 1):  # every rank has the same number of rows of each minibatch
        assert len({sum(mb.minibatch == k for mb in r) for r in two.per_rank}) == 1
    for r in two.per_rank:  # rows ordered by minibatch
        assert [mb.minibatch for mb in r] == sorted(mb.minibatch for mb in r)


def test_overlong_samples_dropped_counted_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    packer = Packer(seq_len=16, pad_to_multiple_of=4)
    batch = [sample(4, 8), sample(4, 20), sample(2, 2), sample(10, 10)]
    with caplog.at_level(logging.WARNING, logger="telescope.core.packing"):
        first = packer.pack(batch)
        second = packer.pack(batch)
    assert first.num_dropped_samples == 2 and first.dropped_sample_indices == [1, 3]
    assert first.num_samples == 2 and first.metrics()["packing/dropped_overlong_samples"] == 2.0
    assert second.num_dropped_samples == 2
    kept = {i for mb in first.per_rank[0] for i in mb.sample_index if i >= 0}
    assert kept == {0, 2}  # dropped, never truncated into a row
    warnings = [r for r in caplog.records if "longer than seq_len" in r.getMessage()]
    assert len(warnings) == 1


def test_bad_samples_and_settings_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="inference_logprobs has 1 values but completion_ids has 2"):
        pack_samples([TrainSample([1], [2, 3], [-1.0], advantage=0.0)], seq_len=8)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        pack_samples([TrainSample([], [2], [-1.0], advantage=0.0)], seq_len=8)
    with pytest.raises(ValueError, match="loss_mask has 3 values"):
        pack_samples([TrainSample([1], [2], [-1.0], advantage=0.0, loss_mask=[1, 1, 1])], seq_len=8)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        Packer(seq_len=0)
