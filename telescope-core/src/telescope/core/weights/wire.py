"""The weight-sync message format (shared by sender and receiver).

A sync is a sequence of messages. Each message starts with its *first buffer*: an int64[8]
header ``[OP_TENSORS, meta_nbytes, version, message_index, flags, meta_id, 0, 0]`` (64 bytes),
followed, when ``FLAG_COMBINED`` is set, by the message's flat bucket. Then come:

- unless combined: a JSON metadata blob of ``meta_nbytes`` bytes, or none when ``meta_nbytes``
  is 0 (the metadata with content hash ``meta_id`` travelled earlier in this group and every
  member keeps it in its ``MetaCache``), then the flat bucket as its own buffer (if any);
- every direct tensor as its own byte buffer, in metadata order.

Why combined: on gloo every broadcast has a fixed cost (~0.4-0.8 ms for 1 sender and 2
receivers on our 2-core machines), and a receiver cannot post a buffer whose size it does not
know. Every member keeps the same ``LayoutHistory`` (the layout each message index had in the
group's previous sync), so the size of message i's first buffer is known to all in advance:
64 bytes plus the flat size the history predicts. When the sender's layout is the predicted one
(every sync after the first, for a fixed model) the header and the bucket travel in one
broadcast that receivers posted before the sender even started; otherwise the first buffer is
still the predicted size (only its header is read) and the message goes on the long way.

``flags``: ``FLAG_LAST`` marks the sync's last message (the sender looks one tensor ahead, so no
end message is needed). Fingerprints do not travel here: the sender reports its own, each server
reports what it received and loaded, and ``verify.check_sync`` compares them.

Payloads travel as raw bytes, so every dtype (fp32, bf16, fp8, ...) crosses every backend.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

__all__ = [
    "FLAG_COMBINED",
    "FLAG_LAST",
    "HEADER_BYTES",
    "HEADER_LEN",
    "Layout",
    "LayoutHistory",
    "MetaCache",
    "OP_TENSORS",
    "MessageMeta",
    "TensorSlot",
    "dtype_from_name",
    "meta_id",
    "dtype_name",
    "tensor_bytes",
]

OP_TENSORS = 1
HEADER_LEN = 8
HEADER_BYTES = HEADER_LEN * 8  # a multiple of 16: bucketed tensors after it stay aligned for any dtype
FLAG_LAST = 1
FLAG_COMBINED = 2


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

    @property
    def slots(self) -> list[TensorSlot]:
        """Every tensor of the message in wire order (flat ones, then direct ones)."""
        return self.flat + self.direct

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


def meta_id(blob: bytes) -> int:
    """Content hash of a metadata blob, as a signed int64 (it travels in the header)."""
    value = xxhash.xxh3_64_intdigest(blob)
    return value - (1 << 64) if value >= 1 << 63 else value


class MetaCache:
    """Metadata sent in a group, by ``meta_id``; every member holds the same entries.

    Members insert only when a blob actually travels (the sender after sending it, receivers
    after receiving it) and evict the oldest beyond ``capacity``, so all caches stay identical
    without any extra message. Content addressing (not message index) means that layouts which
    alternate (several senders, or models, on one group) all stay cached.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, Any] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def get(self, key: int) -> Any:
        """The cached value of ``key`` (``KeyError`` if never sent or evicted)."""
        return self._entries[key]

    def put(self, key: int, value: Any) -> None:
        """Record a blob that just travelled."""
        self._entries[key] = value
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


@dataclass(frozen=True)
class Layout:
    """The layout one message had: its metadata's content hash and the metadata itself."""

    key: int
    meta: MessageMeta


class LayoutHistory:
    """Per message index, the layout of that message in the group's previous sync.

    Every member updates it the same way after every message (and trims it at the end of a
    sync), so all of them predict the same first-buffer size for the next sync without asking.
    """

    def __init__(self) -> None:
        self._layouts: list[Layout] = []

    def expected(self, index: int) -> Layout | None:
        """The layout message ``index`` had last time (None: no message with that index yet)."""
        return self._layouts[index] if index < len(self._layouts) else None

    def first_nbytes(self, index: int) -> int:
        """Size of message ``index``'s first buffer: the header plus the predicted flat bucket."""
        expected = self.expected(index)
        return HEADER_BYTES + (expected.meta.flat_nbytes if expected is not None else 0)

    def record(self, index: int, layout: Layout) -> None:
        """Message ``index`` of the current sync had ``layout``."""
        if index < len(self._layouts):
            self._layouts[index] = layout
        else:
            self._layouts.append(layout)

    def end_sync(self, num_messages: int) -> None:
        """The sync had ``num_messages`` messages: forget the predictions beyond them."""
        del self._layouts[num_messages:]
