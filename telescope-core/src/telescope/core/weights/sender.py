"""The sending end of a weight sync (trainer rank 0)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from telescope.core.weights.fingerprint import digest, digest_for_device, format_fingerprint
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.settings import WeightSyncSettings
from telescope.core.weights.wire import (
    FLAG_COMBINED,
    FLAG_LAST,
    HEADER_BYTES,
    OP_TENSORS,
    Layout,
    MessageMeta,
    MetaCache,
    TensorSlot,
    dtype_name,
    meta_id,
    tensor_bytes,
)

__all__ = ["SyncReport", "WeightSender"]

_ALIGN = 16
_MAX_PLANS = 64  # distinct message layouts remembered (one per message of each model sent)


@dataclass
class SyncReport:
    """What one sync sent."""

    version: int
    num_tensors: int = 0
    num_bytes: int = 0
    num_messages: int = 0
    num_broadcasts: int = 0
    """Broadcasts issued: per message one first buffer (header, plus the bucket when combined), the
    metadata when it travels, the bucket when not combined, and one per direct tensor."""
    num_combined: int = 0
    """Messages whose header and bucket travelled in one broadcast (the layout was the predicted one)."""
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
        self._dtype = getattr(torch, settings.dtype) if settings.dtype else None
        self._in_flight: list[Any] = []  # work handles of the previous message (kept alive until done)
        self._pool: dict[tuple[str, int], torch.Tensor] = {}  # staging buffers by (role, message index)
        # (name, dtype, shape) of a message's tensors -> (meta, encoded meta, meta id): a fixed model
        # sends the same layouts every sync, so planning and encoding happen once per layout.
        self._plans: dict[tuple[Any, ...], tuple[MessageMeta, bytes, int]] = {}

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncReport:
        """Send every tensor of ``named_tensors`` (consumed lazily, one bucket at a time)."""
        start = time.perf_counter()
        report = SyncReport(version=version, fingerprints={} if self.settings.verify else None)
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
                self._send_message(pending, report, last=upcoming is None)
                pending, pending_bytes = [], 0
        if report.num_messages == 0:  # nothing to send: one empty message still ends the sync
            self._send_message([], report, last=True)
        for work in self._in_flight:
            work.wait()
        self._in_flight = []
        self.group.synchronize()  # NCCL: wait() returned before the transfer; time the transfer itself
        self.group.layouts.end_sync(report.num_messages)
        self._pool = {k: v for k, v in self._pool.items() if k[1] < report.num_messages}
        report.seconds = time.perf_counter() - start
        return report

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """Detach and make contiguous; move to CPU now when staging on CPU or when gloo needs it.

        ``weight_broadcast_pin_memory`` (with CUDA present): an accelerator tensor is copied
        straight into a pinned CPU buffer (one copy, a DMA; not a pageable copy pinned afterwards),
        and a CPU tensor that will go back to a CUDA group (cpu_staging with NCCL) is pinned so that
        copy is asynchronous. A CPU tensor broadcast over gloo never touches a device: not pinned.
        """
        tensor = tensor.detach()
        if self._dtype is not None and tensor.is_floating_point() and tensor.dtype != self._dtype:
            tensor = tensor.to(self._dtype)  # on the trainer's device: a bf16 copy halves the transfer
        if self.settings.cpu_staging or self.group.device.type == "cpu":
            if tensor.device.type != "cpu":
                if self._pin:
                    staged = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
                    tensor = staged.copy_(tensor)
                else:
                    tensor = tensor.to("cpu")
            elif self._pin and self.group.device.type != "cpu" and not tensor.is_pinned():
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

    def _planned(self, pending: list[tuple[str, torch.Tensor]]) -> tuple[MessageMeta, bytes, int]:
        """``(meta, blob, meta id)`` of a message, from the plan cache when the layout was seen."""
        signature = tuple((name, t.dtype, t.shape) for name, t in pending)
        plan = self._plans.get(signature)
        if plan is None:
            meta = self._plan(pending)
            blob = meta.encode()
            plan = (meta, blob, meta_id(blob))
            if len(self._plans) >= _MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[signature] = plan
        return plan

    def _send_message(self, pending: list[tuple[str, torch.Tensor]], report: SyncReport, last: bool) -> None:
        meta, blob, key = self._planned(pending)
        index = report.num_messages
        expected = self.group.layouts.expected(index)
        combined = expected is not None and expected.key == key  # the receivers sized for this layout
        send_meta = not combined and key not in self._meta_cache
        flags = (FLAG_LAST if last else 0) | (FLAG_COMBINED if combined else 0)
        header = [OP_TENSORS, len(blob) if send_meta else 0, report.version, index, flags, key, 0, 0]
        tensors = dict(pending)
        first_nbytes = HEADER_BYTES + meta.flat_nbytes if combined else self.group.layouts.first_nbytes(index)
        first = self._buffer("first", index, first_nbytes)
        first[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor(header, dtype=torch.int64))
        if combined:
            self._fill_flat(first[HEADER_BYTES:], meta, tensors)
        works = [self.group.broadcast(first)]
        if send_meta:
            self._meta_cache.put(key, True)
            report.num_meta_sent += 1
            works.append(
                self.group.broadcast(self._to_device(torch.frombuffer(bytearray(blob), dtype=torch.uint8)))
            )
        if meta.flat and not combined:
            flat = self._buffer("flat", index, meta.flat_nbytes)
            works.append(self.group.broadcast(self._fill_flat(flat, meta, tensors)))
        for slot in meta.direct:
            works.append(self.group.broadcast(tensor_bytes(self._to_device(tensors[slot.name]))))
        self.group.layouts.record(index, Layout(key, meta))
        if report.fingerprints is not None:  # hash while the broadcasts are in flight
            algorithm = digest_for_device(self.group.device)
            for slot in meta.slots:
                report.fingerprints[slot.name] = format_fingerprint(
                    slot.dtype, slot.shape, digest(tensors[slot.name], algorithm), algorithm
                )
        # Double buffering: message i stays in flight while message i+1 is prepared and issued,
        # so the per-message latency of small broadcasts overlaps with the payloads.
        for work in self._in_flight:
            work.wait()
        self._in_flight = works
        report.num_messages += 1
        report.num_combined += int(combined)
        report.num_broadcasts += len(works)
        report.num_tensors += len(pending)
        report.num_bytes += sum(t.numel() * t.element_size() for _, t in pending)
        report.names.extend(slot.name for slot in meta.slots)

    def _fill_flat(
        self, flat: torch.Tensor, meta: MessageMeta, tensors: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Copy the bucketed tensors into ``flat`` at their offsets (the padding between them is never read)."""
        for slot in meta.flat:
            flat[slot.offset : slot.offset + slot.nbytes].copy_(
                tensor_bytes(tensors[slot.name]), non_blocking=True
            )
        return flat

    def _buffer(self, role: str, index: int, nbytes: int) -> torch.Tensor:
        """A staging buffer of message ``index`` (the previous sync's, when the size matches).

        Safe to reuse: a sync waits for all its broadcasts before returning. Why reuse: a fresh
        CPU buffer pays a page fault per 4 KiB on first touch (as slow as the transfer).
        """
        buffer = self._pool.get((role, index))
        if buffer is None or buffer.numel() != nbytes:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
            self._pool[(role, index)] = buffer
        return buffer

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == self.group.device:
            return tensor
        return tensor.to(self.group.device, non_blocking=True)
