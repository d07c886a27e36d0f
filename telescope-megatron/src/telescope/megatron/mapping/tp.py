"""Tensor- and expert-parallel sharding of Megatron state dicts (by parameter name).

Column-parallel weights split dim 0, row-parallel split dim 1, norms and the router are
replicated. ``linear_fc1`` is special: each TP rank holds ``[gate_r; up_r]`` (its slice of the
gate rows, then its slice of the up rows), so the full tensor is not a plain concatenation of
the shards. Fused QKV needs no special case: its per-group interleaving makes a dim-0 split
hand whole query groups to each rank.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import torch

__all__ = [
    "expert_index",
    "rename_expert",
    "shard_state_dict",
    "shard_tensor",
    "tp_partition",
    "unshard_state_dicts",
    "unshard_tensors",
]

Partition = Literal["column", "row", "gated_column", "replicated"]

_EXPERT = re.compile(
    r"^(?P<pre>.*\.mlp\.experts\.)(?:local_experts\.(?P<a>\d+)\.(?P<la>linear_fc[12])\.weight|"
    r"(?P<lb>linear_fc[12])\.weight(?P<b>\d+))$"
)


def tp_partition(name: str) -> Partition:
    """How the parameter ``name`` (a Megatron GPTModel name) is split across TP ranks."""
    if name.endswith(
        ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
    ):
        return "column"
    if name.endswith("linear_fc1.weight") or re.search(r"linear_fc1\.weight\d+$", name):
        return "gated_column"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")) or re.search(
        r"linear_fc2\.weight\d+$", name
    ):
        return "row"
    return "replicated"


def shard_tensor(full: torch.Tensor, partition: Partition, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full``."""
    if partition == "replicated" or tp == 1:
        return full
    dim = 1 if partition == "row" else 0
    if full.shape[dim] % (2 * tp if partition == "gated_column" else tp):
        raise ValueError(
            f"dim {dim} of size {full.shape[dim]} does not split evenly over TP={tp} ({partition})"
        )
    if partition == "gated_column":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0).contiguous()
    return full.chunk(tp, dim=dim)[rank].contiguous()


def unshard_tensors(shards: Sequence[torch.Tensor], partition: Partition) -> torch.Tensor:
    """The full tensor from every TP rank's shard (rank order)."""
    if partition == "replicated" or len(shards) == 1:
        return shards[0]
    if partition == "gated_column":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=1 if partition == "row" else 0)


def shard_state_dict(full: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s TP shard of a full Megatron state dict."""
    return {name: shard_tensor(t, tp_partition(name), tp, rank) for name, t in full.items()}


def unshard_state_dicts(shards: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The full Megatron state dict from every TP rank's state dict (rank order)."""
    names = list(shards[0])
    for r, sd in enumerate(shards[1:], start=1):
        if set(sd) != set(names):
            raise ValueError(
                f"TP rank {r} has different parameter names than rank 0: {sorted(set(sd) ^ set(names))}"
            )
    return {name: unshard_tensors([sd[name] for sd in shards], tp_partition(name)) for name in names}


def expert_index(name: str) -> int | None:
    """The expert number in an expert weight's name (SequentialMLP or TEGroupedMLP naming), else None."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    return int(m.group("a") if m.group("a") is not None else m.group("b"))


def rename_expert(name: str, new_index: int) -> str:
    """``name`` with its expert number replaced (local <-> global under expert parallelism)."""
    m = _EXPERT.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not an expert weight")
    if m.group("a") is not None:
        return f"{m.group('pre')}local_experts.{new_index}.{m.group('la')}.weight"
    return f"{m.group('pre')}{m.group('lb')}.weight{new_index}"
