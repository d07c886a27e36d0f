"""The sending end of a weight sync (trainer rank 0)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from telescope.core.weights.fingerprint import fingerprint
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.settings import DIRECT_TENSOR_BYTES, WeightSyncSettings
from telescope.core.weights.wire import OP_END, OP_TENSORS, MessageMeta, TensorSlot, dtype_name, tensor_bytes

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
        self._meta_cache: list[bytes] = group.meta_cache  # shared with the receivers' view, see group
        self._pin = settings.pin_memory and torch.cuda.is_available()
        self._in_flight: list[Any] = []  # work handles of the previous message (kept alive until done)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncReport:
        """Send every tensor of ``named_tensors`` (consumed lazily, one bucket at a time)."""
        start = time.perf_counter()
        report = SyncReport(version=version, fingerprints={} if self.settings.verify else None)
        pending: list[tuple[str, torch.Tensor]] = []
        pending_bytes = 0
        for name, tensor in named_tensors:
            staged = self._stage(tensor)
            pending.append((name, staged))
            pending_bytes += staged.numel() * staged.element_size()
            if pending_bytes >= self.settings.bucket_bytes:
                self._send_message(pending, report)
                pending, pending_bytes = [], 0
        if pending:
            self._send_message(pending, report)
        self._send_end(report)
        del self._meta_cache[report.num_messages :]
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
        small_limit = min(DIRECT_TENSOR_BYTES, self.settings.bucket_bytes)
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

    def _send_message(self, pending: list[tuple[str, torch.Tensor]], report: SyncReport) -> None:
        meta = self._plan(pending)
        blob = meta.encode()
        index = report.num_messages
        cached = index < len(self._meta_cache) and self._meta_cache[index] == blob
        works = [self._broadcast_header(OP_TENSORS, 0 if cached else len(blob), report.version, index)]
        if not cached:
            works.append(
                self.group.broadcast(self._to_device(torch.frombuffer(bytearray(blob), dtype=torch.uint8)))
            )
        tensors = dict(pending)
        if meta.flat:
            works.append(self.group.broadcast(self._flat_buffer(meta, tensors)))
        for slot in meta.direct:
            works.append(self.group.broadcast(tensor_bytes(self._to_device(tensors[slot.name]))))
        if report.fingerprints is not None:  # hash while the broadcasts are in flight
            for name, tensor in pending:
                report.fingerprints[name] = fingerprint(tensor)
        # Double buffering: message i stays in flight while message i+1 is prepared and issued,
        # so the per-message latency of small broadcasts overlaps with the payloads.
        for work in self._in_flight:
            work.wait()
        self._in_flight = works
        if index < len(self._meta_cache):
            self._meta_cache[index] = blob
        else:
            self._meta_cache.append(blob)
        report.num_messages += 1
        report.num_broadcasts += len(meta.direct) + (1 if meta.flat else 0)
        report.num_tensors += len(pending)
        report.num_bytes += sum(t.numel() * t.element_size() for _, t in pending)
        report.names.extend(name for name, _ in pending)

    def _flat_buffer(self, meta: MessageMeta, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        flat = torch.empty(meta.flat_nbytes, dtype=torch.uint8, device=self.group.device)
        for slot in meta.flat:
            flat[slot.offset : slot.offset + slot.nbytes].copy_(
                tensor_bytes(tensors[slot.name]), non_blocking=True
            )
        return flat

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == self.group.device:
            return tensor
        return tensor.to(self.group.device, non_blocking=True)

    def _broadcast_header(self, op: int, meta_nbytes: int, version: int, index: int):  # type: ignore[no-untyped-def]
        header = torch.tensor([op, meta_nbytes, version, index], dtype=torch.int64)
        return self.group.broadcast(self._to_device(header))

    def _send_end(self, report: SyncReport) -> None:
        for work in self._in_flight:
            work.wait()
        self._in_flight = []
        body = {"version": report.version, "count": report.num_tensors, "fingerprints": report.fingerprints}
        blob = json.dumps(body, separators=(",", ":")).encode()
        self._broadcast_header(OP_END, len(blob), report.version, report.num_messages).wait()
        self.group.broadcast(self._to_device(torch.frombuffer(bytearray(blob), dtype=torch.uint8))).wait()
