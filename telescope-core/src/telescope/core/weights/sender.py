"""The sending end of a weight sync (trainer rank 0)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from telescope.core.weights.fingerprint import digest, format_fingerprint
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.settings import WeightSyncSettings
from telescope.core.weights.wire import (
    FLAG_FINGERPRINTS,
    FLAG_LAST,
    OP_TENSORS,
    MessageMeta,
    MetaCache,
    TensorSlot,
    dtype_name,
    meta_id,
    tensor_bytes,
)

__all__ = ["SyncReport", "WeightSender"]

_ALIGN = 16


@dataclass
class SyncReport:
    """What one sync sent."""

    version: int
    num_tensors: int = 0
    num_bytes: int = 0
    num_messages: int = 0
    num_broadcasts: int = 0
    """Payload broadcasts (per_tensor: one per tensor; flattened_bucket: one per bucket + large tensors)."""
    num_meta_sent: int = 0
    """Messages whose metadata travelled (the others reused metadata every receiver had cached)."""
    seconds: float = 0.0
    fingerprints: dict[str, str] | None = None
    """Sender-side fingerprints by tensor name (None without verification)."""
    names: list[str] = field(default_factory=list)

    @property
    def gb_per_s(self) -> float:
        """Payload throughput."""
        return self.num_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class WeightSender:
    """Broadcasts ``(hf_name, tensor)`` pairs from rank 0 of a ``WeightSyncGroup``."""

    def __init__(self, group: WeightSyncGroup, settings: WeightSyncSettings) -> None:
        if group.rank != 0:
            raise ValueError(f"WeightSender must be rank 0 of its weight-sync group, got rank {group.rank}")
        self.group = group
        self.settings = settings
        self._meta_cache: MetaCache = group.meta_cache  # the receivers hold the same entries, see group
        self._pin = settings.pin_memory and torch.cuda.is_available()
        self._in_flight: list[Any] = []  # work handles of the previous message (kept alive until done)
        # Flat staging buffer per message index, reused by the next sync when its size is unchanged:
        # a fresh CPU buffer pays a page fault per 4 KiB on first touch (as slow as the transfer).
        self._flat_pool: list[torch.Tensor | None] = []

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncReport:
        """Send every tensor of ``named_tensors`` (consumed lazily, one bucket at a time)."""
        start = time.perf_counter()
        report = SyncReport(version=version, fingerprints={} if self.settings.verify else None)
        digests: list[int] = []
        items = iter(named_tensors)
        upcoming = next(items, None)  # one tensor of lookahead: the last message is flagged as such
        pending: list[tuple[str, torch.Tensor]] = []
        pending_bytes = 0
        while upcoming is not None:
            name, tensor = upcoming
            staged = self._stage(tensor)
            pending.append((name, staged))
            pending_bytes += staged.numel() * staged.element_size()
            upcoming = next(items, None)
            if upcoming is None or pending_bytes >= self.settings.bucket_bytes:
                self._send_message(pending, report, digests, last=upcoming is None)
                pending, pending_bytes = [], 0
        if report.num_messages == 0:  # nothing to send: one empty message still ends the sync
            self._send_message([], report, digests, last=True)
        self._send_fingerprints(digests)
        del self._flat_pool[report.num_messages :]
        report.seconds = time.perf_counter() - start
        return report

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """Detach and make contiguous; move to CPU now when staging on CPU or when gloo needs it."""
        tensor = tensor.detach()
        if self.settings.cpu_staging or self.group.device.type == "cpu":
            if tensor.device.type != "cpu":
                tensor = tensor.to("cpu", non_blocking=False)
            if self._pin and not tensor.is_pinned():
                tensor = tensor.pin_memory()
        return tensor.contiguous()

    def _plan(self, pending: list[tuple[str, torch.Tensor]]) -> MessageMeta:
        small_limit = self.settings.direct_tensor_bytes()
        meta = MessageMeta()
        for name, tensor in pending:
            nbytes = tensor.numel() * tensor.element_size()
            bucketed = self.settings.mode == "flattened_bucket" and nbytes < small_limit and len(pending) > 1
            offset = -(-meta.flat_nbytes // _ALIGN) * _ALIGN  # aligned, so the receiver can view any dtype
            slot = TensorSlot(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset if bucketed else -1)
            if bucketed:
                meta.flat.append(slot)
                meta.flat_nbytes = offset + nbytes
            else:
                meta.direct.append(slot)
        return meta

    def _send_message(
        self, pending: list[tuple[str, torch.Tensor]], report: SyncReport, digests: list[int], last: bool
    ) -> None:
        meta = self._plan(pending)
        blob = meta.encode()
        index = report.num_messages
        key = meta_id(blob)
        cached = key in self._meta_cache
        flags = (FLAG_LAST if last else 0) | (FLAG_FINGERPRINTS if last and self.settings.verify else 0)
        works = [self._broadcast_header(0 if cached else len(blob), report.version, index, flags, key)]
        if not cached:
            self._meta_cache.put(key, True)
            report.num_meta_sent += 1
            works.append(
                self.group.broadcast(self._to_device(torch.frombuffer(bytearray(blob), dtype=torch.uint8)))
            )
        tensors = dict(pending)
        if meta.flat:
            works.append(self.group.broadcast(self._flat_buffer(meta, tensors, index)))
        for slot in meta.direct:
            works.append(self.group.broadcast(tensor_bytes(self._to_device(tensors[slot.name]))))
        if report.fingerprints is not None:  # hash while the broadcasts are in flight
            for slot in meta.slots:
                digests.append(digest(tensors[slot.name]))
                report.fingerprints[slot.name] = format_fingerprint(slot.dtype, slot.shape, digests[-1])
        # Double buffering: message i stays in flight while message i+1 is prepared and issued,
        # so the per-message latency of small broadcasts overlaps with the payloads.
        for work in self._in_flight:
            work.wait()
        self._in_flight = works
        report.num_messages += 1
        report.num_broadcasts += len(meta.direct) + (1 if meta.flat else 0)
        report.num_tensors += len(pending)
        report.num_bytes += sum(t.numel() * t.element_size() for _, t in pending)
        report.names.extend(slot.name for slot in meta.slots)

    def _flat_buffer(self, meta: MessageMeta, tensors: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        flat = self._flat_storage(meta.flat_nbytes, index)
        for slot in meta.flat:
            flat[slot.offset : slot.offset + slot.nbytes].copy_(
                tensor_bytes(tensors[slot.name]), non_blocking=True
            )
        return flat

    def _flat_storage(self, nbytes: int, index: int) -> torch.Tensor:
        """The flat buffer of message ``index`` (the previous sync's, when the size matches).

        Safe to reuse: a sync waits for all its broadcasts before returning, and the padding
        between tensors is never read (fingerprints cover the tensors' own bytes).
        """
        while len(self._flat_pool) <= index:
            self._flat_pool.append(None)
        flat = self._flat_pool[index]
        if flat is None or flat.numel() != nbytes:
            flat = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
            self._flat_pool[index] = flat
        return flat

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == self.group.device:
            return tensor
        return tensor.to(self.group.device, non_blocking=True)

    def _broadcast_header(self, meta_nbytes: int, version: int, index: int, flags: int, key: int) -> Any:
        header = torch.tensor([OP_TENSORS, meta_nbytes, version, index, flags, key], dtype=torch.int64)
        return self.group.broadcast(self._to_device(header))

    def _send_fingerprints(self, digests: list[int]) -> None:
        """After the last message: the digests (with verification), then wait for everything."""
        works = self._in_flight
        if self.settings.verify:
            works.append(self.group.broadcast(self._to_device(torch.tensor(digests, dtype=torch.int64))))
        for work in works:
            work.wait()
        self._in_flight = []
