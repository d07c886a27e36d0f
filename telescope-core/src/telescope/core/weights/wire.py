"""The weight-sync message format (shared by sender and receiver).

A sync is a sequence of messages, each starting with an int64[4] header broadcast
``[op, meta_nbytes, version, message_index]``:

- ``OP_TENSORS``: a JSON metadata blob of ``meta_nbytes`` bytes follows (0 = identical to the
  metadata of the same message index in the previous sync, which both sides cached), then the
  payloads: one flat byte buffer holding the small tensors (if any), then every direct tensor
  as its own byte buffer, in metadata order.
- ``OP_END``: a JSON blob follows with the version, the tensor count and (with verification)
  the sender's fingerprints.

Payloads travel as raw bytes, so every dtype (fp32, bf16, fp8, ...) crosses every backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "OP_END",
    "OP_TENSORS",
    "MessageMeta",
    "TensorSlot",
    "dtype_from_name",
    "dtype_name",
    "tensor_bytes",
]

OP_TENSORS = 1
OP_END = 2
HEADER_LEN = 4


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of ``dtype_name``; an unknown name raises naming it."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight-sync metadata names an unknown dtype {name!r}")
    return dtype


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's storage (no copy)."""
    flat = tensor.reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=tensor.device)


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of a message: name, dtype, shape, and (for bucketed tensors) its byte offset."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int = -1  # -1: sent directly as its own payload

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * dtype_from_name(self.dtype).itemsize


@dataclass
class MessageMeta:
    """What one OP_TENSORS message carries."""

    flat: list[TensorSlot] = field(default_factory=list)
    direct: list[TensorSlot] = field(default_factory=list)
    flat_nbytes: int = 0

    def encode(self) -> bytes:
        """Compact JSON bytes."""
        pack = [[s.name, s.dtype, list(s.shape), s.offset] for s in self.flat + self.direct]
        return json.dumps({"t": pack, "f": self.flat_nbytes}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, blob: bytes) -> MessageMeta:
        """Inverse of ``encode``."""
        data: dict[str, Any] = json.loads(blob)
        slots = [TensorSlot(n, d, tuple(s), o) for n, d, s, o in data["t"]]
        return cls([s for s in slots if s.offset >= 0], [s for s in slots if s.offset < 0], int(data["f"]))
