"""The receiving end of a weight sync (one per inference worker)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.fingerprint import compare_fingerprints, digest, format_fingerprint
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.wire import (
    FLAG_FINGERPRINTS,
    FLAG_LAST,
    HEADER_LEN,
    OP_TENSORS,
    MessageMeta,
    MetaCache,
    TensorSlot,
    dtype_from_name,
)

__all__ = ["ReceivedSync", "WeightReceiver"]


@dataclass
class ReceivedSync:
    """The end of one sync as the receiver saw it."""

    version: int
    num_tensors: int
    sender_fingerprints: dict[str, str] | None
    received_fingerprints: dict[str, str] | None


class WeightReceiver:
    """Receives the tensors that rank 0 of the group broadcasts.

    ``receive()`` yields ``(name, tensor)`` as payloads arrive (tensors live on the group's
    device). When the sender's end message arrives, the transport is verified: the fingerprints
    of what arrived must equal the sender's, else ``WeightSyncMismatchError`` names the tensors.

    With ``reuse_buffers`` (default) the receive buffers of one sync are reused by the next one
    when the layout is unchanged: the yielded tensors are valid until the next ``receive()``
    (copy them to keep them). Why: a fresh CPU buffer costs a page fault per 4 KiB on first
    touch, which on gloo is as slow as the transfer itself (79 MB: ~40 ms of faults vs ~45 ms
    of broadcast). ``reuse_buffers=False`` yields tensors that are safe to keep (fresh buffers;
    cheap on CUDA, whose caching allocator already reuses memory).
    """

    def __init__(self, group: WeightSyncGroup, *, verify: bool = True, reuse_buffers: bool = True) -> None:
        if group.rank == 0:
            raise ValueError(
                "WeightReceiver cannot be rank 0 of its weight-sync group (rank 0 is the sender)"
            )
        self.group = group
        self.verify = verify
        self._meta_cache: MetaCache = group.meta_cache  # the sender's view holds the same entries, see group
        self.reuse_buffers = reuse_buffers
        self._buffers: list[list[torch.Tensor]] = []  # receive buffers per message index (reuse_buffers)
        self.last_sync: ReceivedSync | None = None

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield every tensor of the next sync, then verify it (see the class docstring)."""
        digests: list[int] = []
        slots: list[TensorSlot] = []
        sent: torch.Tensor | None = None  # the sender's digests (FLAG_FINGERPRINTS)
        sent_work: Any = None
        header_work, header = self._post_header()
        while True:
            header_work.wait()
            op, meta_nbytes, version, index, flags, key = (int(v) for v in header.cpu().tolist())
            if op != OP_TENSORS:
                raise WeightSyncError(
                    f"weight-sync protocol error: unknown message op {op} (message {index})"
                )
            meta = self._message_meta(meta_nbytes, index, key)
            payloads = self._post_payloads(meta, index)
            slots.extend(meta.slots)
            last = bool(flags & FLAG_LAST)
            # Post what follows now: collectives match in issue order, and this hides its latency.
            if not last:
                header_work, header = self._post_header()
            elif flags & FLAG_FINGERPRINTS:
                sent = torch.empty(len(slots), dtype=torch.int64, device=self.group.device)
                sent_work = self.group.broadcast(sent)
            # Payload by payload: fingerprint (and hand out) one while the next ones are in flight.
            for work, tensors in payloads:
                work.wait()
                for name, tensor in tensors:
                    if self.verify:
                        digests.append(digest(tensor))
                    yield name, tensor
            if last:
                break
        del self._buffers[index + 1 :]
        sender = None
        if sent is not None:
            sent_work.wait()
            sender = _formatted(slots, sent.cpu().tolist())
        self._finish(version, slots, sender, _formatted(slots, digests) if self.verify else None)

    def receive_all(self) -> dict[str, torch.Tensor]:
        """``receive()`` collected into an ordered dict."""
        return dict(self.receive())

    def _post_header(self) -> tuple[Any, torch.Tensor]:
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.group.device)
        return self.group.broadcast(header), header

    def _blob(self, nbytes: int) -> bytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
        self.group.broadcast_now(buf)
        return bytes(buf.cpu().numpy().tobytes())

    def _message_meta(self, meta_nbytes: int, index: int, key: int) -> MessageMeta:
        if meta_nbytes == 0:
            if key not in self._meta_cache:
                raise WeightSyncError(
                    f"weight-sync protocol error: message {index} reuses metadata {key:#x} never received"
                )
            return self._meta_cache.get(key)
        meta = MessageMeta.decode(self._blob(meta_nbytes))
        self._meta_cache.put(key, meta)
        return meta

    def _post_payloads(
        self, meta: MessageMeta, index: int
    ) -> list[tuple[Any, list[tuple[str, torch.Tensor]]]]:
        """Post the receives of one message: ``(work, tensors valid once the work is done)`` per payload."""
        buffers = self._payload_buffers(meta, index)
        payloads = []
        if meta.flat:
            flat = buffers[0]
            tensors = [(s.name, _typed(flat[s.offset : s.offset + s.nbytes], s)) for s in meta.flat]
            payloads.append((self.group.broadcast(flat), tensors))
        for slot, raw in zip(meta.direct, buffers[1 if meta.flat else 0 :], strict=True):
            payloads.append((self.group.broadcast(raw), [(slot.name, _typed(raw, slot))]))
        return payloads

    def _payload_buffers(self, meta: MessageMeta, index: int) -> list[torch.Tensor]:
        """Byte buffers of one message (flat first), reused from the last sync when the sizes match."""
        sizes = ([meta.flat_nbytes] if meta.flat else []) + [slot.nbytes for slot in meta.direct]
        if self.reuse_buffers and index < len(self._buffers):
            previous = self._buffers[index]
            if [b.numel() for b in previous] == sizes:
                return previous
        buffers = [torch.empty(n, dtype=torch.uint8, device=self.group.device) for n in sizes]
        if self.reuse_buffers:
            if index < len(self._buffers):
                self._buffers[index] = buffers
            else:
                self._buffers.append(buffers)
        return buffers

    def _finish(
        self,
        version: int,
        slots: list[TensorSlot],
        sender: dict[str, str] | None,
        received: dict[str, str] | None,
    ) -> None:
        self.last_sync = ReceivedSync(version, len(slots), sender, received)
        if received is not None and sender is not None:
            compare_fingerprints(
                sender, received, where=f"transport, version {version}, rank {self.group.rank}"
            )


def _typed(raw: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    """The bytes of one tensor viewed with its dtype and shape (no copy)."""
    return raw.view(dtype_from_name(slot.dtype)).view(slot.shape)


def _formatted(slots: list[TensorSlot], digests: list[int]) -> dict[str, str]:
    """Fingerprint strings by name from wire digests (same order as ``slots``)."""
    return {s.name: format_fingerprint(s.dtype, s.shape, d) for s, d in zip(slots, digests, strict=True)}
