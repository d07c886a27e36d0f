"""A batched, left-padded KV cache that sequences join and leave between decode steps.

Rows are sequences; every row has the same cache length, shorter rows padded on the left
and masked out by ``mask`` [B, L] (1 = real token). Joining pads the shorter side on the left
and concatenates; leaving selects rows; columns that are padding in every row are dropped.
Stored as plain (key, value) tensors per layer and wrapped in a ``DynamicCache`` per forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

__all__ = ["BatchCache", "PaddedBatch"]

KV = list[tuple[torch.Tensor, torch.Tensor]]


class BatchCache:
    """Per-layer keys/values [B, heads, L, dim] plus the padding mask [B, L]."""

    def __init__(self, layers: KV, mask: torch.Tensor) -> None:
        self.layers = layers
        self.mask = mask

    @property
    def rows(self) -> int:
        """Number of sequences."""
        return int(self.mask.shape[0])

    def as_dynamic_cache(self, config: Any) -> DynamicCache:
        """A transformers cache over these tensors (the forward appends to it)."""
        return DynamicCache(ddp_cache_data=self.layers, config=config)

    def absorb(self, cache: DynamicCache, new_mask: torch.Tensor) -> None:
        """Take back the tensors of ``cache`` after a forward that appended ``new_mask``'s columns."""
        self.layers = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]
        self.mask = new_mask

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (in that order), then drop all-padding columns."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.layers = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers]
        self.mask = self.mask.index_select(0, index)
        self._trim_left()

    def _trim_left(self) -> None:
        if self.rows == 0:
            return
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else self.mask.shape[1]
        if start > 0:
            self.layers = [(k[:, :, start:], v[:, :, start:]) for k, v in self.layers]
            self.mask = self.mask[:, start:]

    def join(self, other: BatchCache) -> None:
        """Append ``other``'s rows (left-padding whichever side is shorter)."""
        if self.rows == 0:
            self.layers, self.mask = other.layers, other.mask
            return
        length = max(self.mask.shape[1], other.mask.shape[1])
        mine, theirs = self._padded(length), other._padded(length)
        self.layers = [
            (torch.cat([k1, k2]), torch.cat([v1, v2]))
            for (k1, v1), (k2, v2) in zip(mine[0], theirs[0], strict=True)
        ]
        self.mask = torch.cat([mine[1], theirs[1]])

    def _padded(self, length: int) -> tuple[KV, torch.Tensor]:
        extra = length - self.mask.shape[1]
        if extra == 0:
            return self.layers, self.mask
        pad = torch.nn.functional.pad
        layers = [(pad(k, (0, 0, extra, 0)), pad(v, (0, 0, extra, 0))) for k, v in self.layers]
        return layers, pad(self.mask, (extra, 0))


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, BatchCache], torch.Tensor]
"""(ids, mask, positions, cache) -> last-position logits; the cache absorbs the new keys/values."""


class PaddedBatch:
    """Running rows over a ``BatchCache`` and the model's own forward: the decode path of models
    ``decoder.SlotDecoder`` does not cover (the same interface: ``add``, ``keep``, ``step``)."""

    def __init__(self, forward: Forward, device: torch.device) -> None:
        self._forward = forward
        self.device = device
        self.cache = BatchCache([], torch.zeros(0, 0, dtype=torch.long, device=device))

    @property
    def rows(self) -> int:
        """Number of running rows."""
        return self.cache.rows

    @property
    def tokens(self) -> int:
        """Tokens held in the cache over all rows."""
        return int(self.cache.mask.sum()) if self.cache.rows else 0

    def add(self, prompts: list[KV]) -> None:
        """Append one row per entry: its per-layer keys/values [1, heads, len, dim] (no padding)."""
        if not prompts:
            return
        width = max(int(p[0][0].shape[2]) for p in prompts)

        def left_padded(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, width - t.shape[2], 0))

        layers = [
            (
                torch.cat([left_padded(p[n][0]) for p in prompts]),
                torch.cat([left_padded(p[n][1]) for p in prompts]),
            )
            for n in range(len(prompts[0]))
        ]
        mask = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends in the last column
            mask[row, width - int(prompt[0][0].shape[2]) :] = 1
        self.cache.join(BatchCache(layers, mask))

    def keep(self, rows: list[int]) -> None:
        """Keep rows ``rows`` (in that order); the others leave."""
        if rows:
            self.cache.select(rows)
        else:
            self.cache = BatchCache([], torch.zeros(0, 0, dtype=torch.long, device=self.device))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens`` [rows]); returns the next-token logits [rows, vocab]."""
        ones = torch.ones(self.cache.rows, 1, dtype=torch.long, device=self.device)
        mask = torch.cat([self.cache.mask, ones], 1)
        positions = mask.sum(1, keepdim=True) - 1
        return self._forward(tokens.unsqueeze(1), mask, positions, self.cache)
