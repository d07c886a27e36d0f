"""Sequence packing: samples -> padded micro-batch rows, balanced across data-parallel ranks.

Backend-agnostic and torch-free (plain lists), shared by every trainer backend.

Layout of one packed row (a ``MicroBatch``): the samples' ``prompt + completion`` token ids
concatenated, then padding up to a multiple of ``pad_to_multiple_of``. ``position_ids``
restart at 0 for every sample (the padding forms its own segment), which is how attention
kernels keep packed samples apart. Per-token fields are aligned with ``input_ids``: element t
describes token t itself (its loss mask, the logprob the inference engine gave it, its
sample's advantage). A trainer predicting token t+1 from position t uses ``field[1:]``.

Rules:
- a sample longer than ``seq_len`` is never truncated: it is dropped, counted in
  ``PackedBatch.num_dropped_samples`` and warned about once per ``Packer``;
- samples are first split into ``num_minibatches`` token-balanced minibatches (each its own
  optimizer step); the split depends only on the samples, never on the number of ranks, so
  1 rank and N ranks train on the same minibatches;
- each minibatch is packed into rows of at most ``seq_len`` real tokens (first-fit-decreasing),
  and every rank gets the same number of rows of each minibatch so collective operations line
  up; rows are spread so ranks get similar token counts;
- when there are fewer samples than rows needed, the extra rows are pure padding of
  ``pad_to_multiple_of`` tokens (cheap) rather than copies of real rows;
- a row is padded up to the next multiple of ``pad_to_multiple_of``, so when ``seq_len`` is
  not itself a multiple, a full row can be up to ``pad_to_multiple_of - 1`` tokens longer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from telescope.core.trainer import TrainSample

__all__ = ["MicroBatch", "PackedBatch", "Packer", "minibatch_groups", "pack_samples"]

logger = logging.getLogger(__name__)


@dataclass
class MicroBatch:
    """One packed row; every list has the same length (the padded row length)."""

    input_ids: list[int]
    """Token ids of the packed samples followed by padding."""
    position_ids: list[int]
    """Position inside the token's own sample; restarts at 0 per sample and for the padding."""
    loss_mask: list[int]
    """1 where the token is a trained completion token, else 0 (prompt, env tokens, padding)."""
    inference_logprobs: list[float]
    """Logprob the inference engine gave the token (0.0 for prompt tokens and padding)."""
    advantages: list[float]
    """The token's sample advantage (0.0 for padding)."""
    sample_index: list[int]
    """Index of the token's sample in the list given to ``pack``; -1 for padding."""
    num_samples: int
    """Number of real samples in the row."""
    num_real_tokens: int
    """Tokens that belong to samples (the rest is padding)."""
    minibatch: int = 0
    """Index of the minibatch (optimizer step) the row belongs to."""

    @property
    def length(self) -> int:
        """Padded row length."""
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        """Tokens with ``loss_mask == 1``."""
        return sum(self.loss_mask)


@dataclass
class PackedBatch:
    """The packed training batch: ``per_rank[r]`` is rank r's list of rows."""

    per_rank: list[list[MicroBatch]]
    """Rows per data-parallel rank, ordered by minibatch; every rank has the same number of rows
    of each minibatch."""
    num_samples: int
    """Samples packed (after dropping over-long ones)."""
    num_dropped_samples: int
    """Samples dropped because they were longer than ``seq_len``."""
    num_real_tokens: int
    """Sample tokens over all rows and ranks."""
    num_slots: int
    """Padded row lengths summed over all rows and ranks."""
    dropped_sample_indices: list[int] = field(default_factory=list)
    """Indices (into the input list) of the dropped samples."""

    @property
    def packing_efficiency(self) -> float:
        """Real tokens / slots (1.0 = no padding); 0.0 for an empty batch."""
        return self.num_real_tokens / self.num_slots if self.num_slots else 0.0

    def metrics(self) -> dict[str, float]:
        """Step metrics describing the packing."""
        return {
            "packing/efficiency": self.packing_efficiency,
            "packing/dropped_overlong_samples": float(self.num_dropped_samples),
            "packing/micro_batches_per_rank": float(len(self.per_rank[0]) if self.per_rank else 0),
            "packing/samples": float(self.num_samples),
        }


class Packer:
    """Packs batches with fixed settings and warns about over-long samples once."""

    def __init__(
        self,
        seq_len: int,
        pad_to_multiple_of: int = 64,
        dp_world_size: int = 1,
        *,
        num_minibatches: int = 1,
        pad_token_id: int = 0,
    ) -> None:
        for name, value in (
            ("seq_len", seq_len),
            ("pad_to_multiple_of", pad_to_multiple_of),
            ("dp_world_size", dp_world_size),
            ("num_minibatches", num_minibatches),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Packer {name} must be a positive int, got {value!r}")
        self.seq_len = seq_len
        self.pad_to_multiple_of = pad_to_multiple_of
        self.dp_world_size = dp_world_size
        self.num_minibatches = num_minibatches
        self.pad_token_id = pad_token_id
        self._warned_overlong = False

    def pack(self, samples: list[TrainSample]) -> PackedBatch:
        """Pack ``samples`` into equal-count, token-balanced rows for each rank."""
        lengths = [s.validate().length for s in samples]
        keep = [i for i, n in enumerate(lengths) if n <= self.seq_len]
        dropped = [i for i, n in enumerate(lengths) if n > self.seq_len]
        if dropped and not self._warned_overlong:
            self._warned_overlong = True
            logger.warning(
                "dropping %d sample(s) longer than seq_len=%d (longest %d tokens); they are counted "
                "in packing/dropped_overlong_samples. Raise seq_len or lower max_tokens. "
                "(warned once)",
                len(dropped),
                self.seq_len,
                max(lengths[i] for i in dropped),
            )
        per_rank: list[list[MicroBatch]] = [[] for _ in range(self.dp_world_size)]
        for k, group in enumerate(split_minibatches(keep, lengths, self.num_minibatches)):
            bins = first_fit_decreasing(group, lengths, self.seq_len)
            bins = _spread_to(bins, _round_up(max(len(bins), 1), self.dp_world_size), lengths, self.seq_len)
            for rank, rank_bins in enumerate(balance_bins(bins, lengths, self.dp_world_size)):
                per_rank[rank] += [self._build_row(b, samples, k) for b in rank_bins]
        rows = [mb for rank in per_rank for mb in rank]
        return PackedBatch(
            per_rank=per_rank,
            num_samples=len(keep),
            num_dropped_samples=len(dropped),
            num_real_tokens=sum(mb.num_real_tokens for mb in rows),
            num_slots=sum(mb.length for mb in rows),
            dropped_sample_indices=dropped,
        )

    def _build_row(self, indices: list[int], samples: list[TrainSample], minibatch: int) -> MicroBatch:
        row = MicroBatch(
            [], [], [], [], [], [], num_samples=len(indices), num_real_tokens=0, minibatch=minibatch
        )
        for i in indices:
            s = samples[i]
            n_prompt, n_comp = len(s.prompt_ids), len(s.completion_ids)
            row.input_ids += list(s.prompt_ids) + list(s.completion_ids)
            row.position_ids += list(range(n_prompt + n_comp))
            row.loss_mask += [0] * n_prompt + [int(bool(m)) for m in s.effective_loss_mask()]
            row.inference_logprobs += [0.0] * n_prompt + [float(x) for x in s.inference_logprobs]
            row.advantages += [float(s.advantage)] * (n_prompt + n_comp)
            row.sample_index += [i] * (n_prompt + n_comp)
        row.num_real_tokens = len(row.input_ids)
        pad = _round_up(max(row.num_real_tokens, 1), self.pad_to_multiple_of) - row.num_real_tokens
        row.input_ids += [self.pad_token_id] * pad
        row.position_ids += list(range(pad))
        row.loss_mask += [0] * pad
        row.inference_logprobs += [0.0] * pad
        row.advantages += [0.0] * pad
        row.sample_index += [-1] * pad
        return row


def pack_samples(
    samples: list[TrainSample],
    seq_len: int,
    pad_to_multiple_of: int = 64,
    dp_world_size: int = 1,
    *,
    num_minibatches: int = 1,
    pad_token_id: int = 0,
) -> PackedBatch:
    """One-shot ``Packer(...).pack(samples)``."""
    packer = Packer(
        seq_len, pad_to_multiple_of, dp_world_size, num_minibatches=num_minibatches, pad_token_id=pad_token_id
    )
    return packer.pack(samples)


def split_minibatches(indices: list[int], lengths: list[int], num_minibatches: int) -> list[list[int]]:
    """``num_minibatches`` groups of sample indices with similar token counts (longest first,
    each to the lightest group); depends on the samples only, not on the rank count."""
    groups: list[list[int]] = [[] for _ in range(num_minibatches)]
    load = [0] * num_minibatches
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        k = min(range(num_minibatches), key=lambda k: (load[k], k))
        groups[k].append(i)
        load[k] += lengths[i]
    return groups


def first_fit_decreasing(indices: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of sample indices, longest first, each sample in the first bin with room."""
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


def _spread_to(bins: list[list[int]], target: int, lengths: list[int], capacity: int) -> list[list[int]]:
    """Redistribute into exactly ``target`` bins (>= len(bins)), balancing tokens.

    Longest-first into the least-loaded bin that has room. Should that greedy pass fail to
    place a sample, the first-fit-decreasing layout is kept and topped up with empty bins.
    Bins left empty become padding-only rows.
    """
    if target == len(bins):
        return bins
    items = sorted((i for b in bins for i in b), key=lambda i: (-lengths[i], i))
    spread: list[list[int]] = [[] for _ in range(target)]
    load = [0] * target
    for i in items:
        candidates = [b for b in range(target) if load[b] + lengths[i] <= capacity]
        if not candidates:  # greedy balance failed: keep the FFD layout plus empty rows
            return bins + [[] for _ in range(target - len(bins))]
        best = min(candidates, key=lambda b: (load[b], b))
        spread[best].append(i)
        load[best] += lengths[i]
    return spread


def balance_bins(bins: list[list[int]], lengths: list[int], num_ranks: int) -> list[list[list[int]]]:
    """Assign bins to ranks: equal bin counts, heaviest bin to the lightest rank with room."""
    if len(bins) % num_ranks:
        raise ValueError(f"{len(bins)} rows cannot be split evenly over {num_ranks} ranks")
    per_rank = len(bins) // num_ranks
    order = sorted(range(len(bins)), key=lambda b: (-sum(lengths[i] for i in bins[b]), b))
    ranks: list[list[list[int]]] = [[] for _ in range(num_ranks)]
    load = [0] * num_ranks
    for b in order:
        open_ranks = [r for r in range(num_ranks) if len(ranks[r]) < per_rank]
        r = min(open_ranks, key=lambda r: (load[r], r))
        ranks[r].append(bins[b])
        load[r] += sum(lengths[i] for i in bins[b])
    return ranks


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def minibatch_groups(minibatch_of_row: list[int], num_minibatches: int) -> list[list[int]]:
    """Row indices per minibatch, from the packer's ``MicroBatch.minibatch`` labels."""
    if minibatch_of_row and (min(minibatch_of_row) < 0 or max(minibatch_of_row) >= num_minibatches):
        raise ValueError(
            f"rows are labelled with minibatches {sorted(set(minibatch_of_row))} but number_of_minibatches is "
            f"{num_minibatches}: pack with Packer(num_minibatches=cfg.number_of_minibatches)"
        )
    groups = [[i for i, k in enumerate(minibatch_of_row) if k == j] for j in range(num_minibatches)]
    return [g for g in groups if g]
