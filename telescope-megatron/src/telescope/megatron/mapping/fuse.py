"""Tensor layouts that differ between HF and Megatron: fused QKV, fused gate/up, padded vocab."""

from __future__ import annotations

import torch

from telescope.megatron.mapping.spec import ModelSpec

__all__ = ["fuse_gate_up", "fuse_qkv", "pad_vocab", "split_gate_up", "split_qkv", "unpad_vocab"]


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Megatron's ``linear_qkv`` (weight ``[rows, hidden]`` or bias ``[rows]``) from HF q/k/v.

    Rows are interleaved per query group: for each of the ``num_key_value_heads`` groups, that
    group's ``heads_per_group`` query heads, then its key head, then its value head. This is
    what lets TP shard the fused tensor by a plain split along dim 0 (whole groups per rank).
    """
    groups, d = spec.num_key_value_heads, spec.head_dim
    tail = q.shape[1:]
    parts = (
        q.reshape(groups, spec.heads_per_group * d, *tail),
        k.reshape(groups, d, *tail),
        v.reshape(groups, d, *tail),
    )
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def split_qkv(qkv: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_qkv``: HF ``(q, k, v)`` from Megatron's interleaved ``linear_qkv``."""
    groups, d = spec.num_key_value_heads, spec.head_dim
    q_rows = spec.heads_per_group * d
    tail = qkv.shape[1:]
    expected = groups * (q_rows + 2 * d)
    if qkv.shape[0] != expected:
        raise ValueError(
            f"linear_qkv has {qkv.shape[0]} rows but the model needs {expected} "
            f"({groups} groups x ({spec.heads_per_group} q heads + k + v) x head_dim {d}); "
            "is it a single tensor-parallel shard? gather the shards first"
        )
    grouped = qkv.reshape(groups, q_rows + 2 * d, *tail)
    q, k, v = torch.split(grouped, [q_rows, d, d], dim=1)
    return (
        q.reshape(-1, *tail).contiguous(),
        k.reshape(-1, *tail).contiguous(),
        v.reshape(-1, *tail).contiguous(),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Megatron's unsharded ``linear_fc1``: the gate rows, then the up rows."""
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_gate_up`` (of an unsharded ``linear_fc1``)."""
    if fc1.shape[0] % 2:
        raise ValueError(f"linear_fc1 has an odd number of rows ({fc1.shape[0]}): not a fused gate/up weight")
    gate, up = fc1.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def pad_vocab(weight: torch.Tensor, padded_rows: int) -> torch.Tensor:
    """Zero rows appended up to ``padded_rows`` (padded tokens are never sampled nor trained)."""
    extra = padded_rows - weight.shape[0]
    if extra < 0:
        raise ValueError(f"vocabulary has {weight.shape[0]} rows, more than the padded size {padded_rows}")
    if extra == 0:
        return weight
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])], dim=0)


def unpad_vocab(weight: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The first ``vocab_size`` rows (drops Megatron's padding)."""
    return weight[:vocab_size].contiguous()
