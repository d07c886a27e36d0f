"""The receiving end of a weight sync (one per inference worker)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from telescope.core.weights import wire
from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.fingerprint import digest, digest_for_device, format_fingerprint, sum64_tensor
from telescope.core.weights.group import WeightSyncGroup

__all__ = ["ReceivedSync", "WeightReceiver"]


@dataclass
class ReceivedSync:
    """The end of one sync as the receiver saw it."""

    version: int
    num_tensors: int
    received_fingerprints: dict[str, str] | None
    """Fingerprints of what arrived, by name (None without verification); ``verify.check_sync``
    compares them, or the fingerprints of what the server then loaded, with the sender's."""


class WeightReceiver:
    """Receives the tensors that rank 0 of the group broadcasts.

    ``receive()`` yields ``(name, tensor)`` as payloads arrive (tensors live on the group's
    device) and, with ``verify``, fingerprints each payload while the next ones are in flight:
    ``last_sync.received_fingerprints`` is what the orchestrator compares with the sender's.

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
        self._meta_cache: wire.MetaCache = (
            group.meta_cache
        )  # the sender's view holds the same entries, see group
        self.reuse_buffers = reuse_buffers
        self._pool: dict[tuple[str, int, int], torch.Tensor] = {}  # (role, message, j) -> buffer
        # (message index, layout key) -> (first buffer, typed views of its bucket): with reused
        # buffers and a repeated layout the views are the same objects every sync, made once.
        self._views: dict[tuple[int, int], tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]] = {}
        self.last_sync: ReceivedSync | None = None

    def receive(self, expect_version: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield every tensor of the next sync (see the class docstring).

        ``expect_version``: raise ``WeightSyncError`` before yielding anything when the sync
        carries another version, so a consumer that loads tensors as they stream in (vLLM's
        ``load_weights``) never applies part of the wrong weights.
        """
        digests: list[int] = []
        algorithm = digest_for_device(self.group.device)  # the sender's (same group, same device kind)
        on_device: list[torch.Tensor] = []  # sum64 digests, read back once at the end (no sync per tensor)
        slots: list[wire.TensorSlot] = []
        index, version = 0, -1
        first_work, first = self._post_first(0)
        while True:
            first_work.wait()
            version, flags, meta, payloads = self._open_message(first, index)
            if expect_version is not None and version != expect_version:
                raise WeightSyncError(
                    f"weight sync: this server was asked to load version {expect_version} but the trainer "
                    f"is sending version {version}; the orchestrator and the trainer are out of step"
                )
            slots.extend(meta.slots)
            last = bool(flags & wire.FLAG_LAST)
            if not last:  # post the next first buffer now: its size is known, and this hides its latency
                first_work, first = self._post_first(index + 1)
            for work, tensors in payloads:  # hash (and hand out) one payload while the next ones arrive
                if work is not None:
                    work.wait()
                for name, tensor in tensors:
                    if self.verify and algorithm == "sum64":
                        on_device.append(sum64_tensor(tensor))
                    elif self.verify:
                        digests.append(digest(tensor, algorithm))
                    yield name, tensor
            if last:
                break
            index += 1
        self.group.layouts.end_sync(index + 1)
        self._pool = {k: v for k, v in self._pool.items() if k[1] <= index}
        self._views = {k: v for k, v in self._views.items() if k[0] <= index}
        if on_device:
            digests = [int(v) for v in torch.stack(on_device).tolist()]
        received = _formatted(slots, digests, algorithm) if self.verify else None
        self.last_sync = ReceivedSync(version, len(slots), received)

    def receive_all(self) -> dict[str, torch.Tensor]:
        """``receive()`` collected into an ordered dict."""
        return dict(self.receive())

    def _post_first(self, index: int) -> tuple[Any, torch.Tensor]:
        """Post message ``index``'s first buffer, sized from the group's layout history."""
        first = self._buffer("first", index, 0, self.group.layouts.first_nbytes(index))
        return self.group.broadcast(first), first

    def _open_message(
        self, first: torch.Tensor, index: int
    ) -> tuple[int, int, wire.MessageMeta, list[tuple[Any, list[tuple[str, torch.Tensor]]]]]:
        """Read a message's header; post its remaining receives: ``(version, flags, meta, payloads)``."""
        op, meta_nbytes, version, sent_index, flags, key = (
            int(v) for v in first[: wire.HEADER_BYTES].view(torch.int64)[:6].cpu().tolist()
        )
        if op != wire.OP_TENSORS or sent_index != index:
            raise WeightSyncError(
                f"weight-sync protocol error: got op {op} for message {sent_index}, expected "
                f"op {wire.OP_TENSORS} for message {index}"
            )
        if flags & wire.FLAG_COMBINED:
            expected = self.group.layouts.expected(index)
            if expected is None or expected.key != key:
                raise WeightSyncError(
                    f"weight-sync protocol error: message {index} claims the predicted layout {key:#x}, "
                    "which this receiver does not hold"
                )
            meta = expected.meta
            flat = [(None, self._bucket_views(first, index, key, meta))] if meta.flat else []
            payloads = flat + self._post_direct(meta, index)
        else:
            meta = self._message_meta(meta_nbytes, index, key)
            payloads = self._post_flat(meta, index) + self._post_direct(meta, index)
        self.group.layouts.record(index, wire.Layout(key, meta))
        return version, flags, meta, payloads

    def _bucket_views(
        self, first: torch.Tensor, index: int, key: int, meta: wire.MessageMeta
    ) -> list[tuple[str, torch.Tensor]]:
        """The bucketed tensors as views of ``first`` (cached while buffer and layout repeat)."""
        cached = self._views.get((index, key))
        if cached is not None and cached[0] is first:
            return cached[1]
        views = _flat_tensors(first[wire.HEADER_BYTES :], meta)
        if self.reuse_buffers:
            self._views = {k: v for k, v in self._views.items() if k[0] != index}
            self._views[(index, key)] = (first, views)
        return views

    def _blob(self, nbytes: int) -> bytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
        self.group.broadcast_now(buf)
        return bytes(buf.cpu().numpy().tobytes())

    def _message_meta(self, meta_nbytes: int, index: int, key: int) -> wire.MessageMeta:
        if meta_nbytes == 0:
            if key not in self._meta_cache:
                raise WeightSyncError(
                    f"weight-sync protocol error: message {index} reuses metadata {key:#x} never received"
                )
            return self._meta_cache.get(key)
        meta = wire.MessageMeta.decode(self._blob(meta_nbytes))
        self._meta_cache.put(key, meta)
        return meta

    def _post_flat(
        self, meta: wire.MessageMeta, index: int
    ) -> list[tuple[Any, list[tuple[str, torch.Tensor]]]]:
        """Post the receive of a bucket that travels on its own (not combined with the header)."""
        if not meta.flat:
            return []
        flat = self._buffer("flat", index, 0, meta.flat_nbytes)
        return [(self.group.broadcast(flat), _flat_tensors(flat, meta))]

    def _post_direct(
        self, meta: wire.MessageMeta, index: int
    ) -> list[tuple[Any, list[tuple[str, torch.Tensor]]]]:
        """Post the receives of the direct tensors: ``(work, [(name, tensor valid once done)])`` each."""
        payloads = []
        for j, slot in enumerate(meta.direct):
            raw = self._buffer("direct", index, j, slot.nbytes)
            payloads.append((self.group.broadcast(raw), [(slot.name, _typed(raw, slot))]))
        return payloads

    def _buffer(self, role: str, index: int, j: int, nbytes: int) -> torch.Tensor:
        """A receive buffer, reused from the last sync when its size matches (``reuse_buffers``)."""
        buffer = self._pool.get((role, index, j)) if self.reuse_buffers else None
        if buffer is None or buffer.numel() != nbytes:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
            if self.reuse_buffers:
                self._pool[(role, index, j)] = buffer
        return buffer


def _flat_tensors(flat: torch.Tensor, meta: wire.MessageMeta) -> list[tuple[str, torch.Tensor]]:
    """The bucketed tensors of ``meta`` as views of ``flat``."""
    return [(s.name, _typed(flat[s.offset : s.offset + s.nbytes], s)) for s in meta.flat]


def _typed(raw: torch.Tensor, slot: wire.TensorSlot) -> torch.Tensor:
    """The bytes of one tensor viewed with its dtype and shape (no copy)."""
    return raw.view(wire.dtype_from_name(slot.dtype)).view(slot.shape)


def _formatted(slots: list[wire.TensorSlot], digests: list[int], algorithm: str) -> dict[str, str]:
    """Fingerprint strings by name from digests (same order as ``slots``)."""
    return {
        s.name: format_fingerprint(s.dtype, s.shape, d, algorithm)
        for s, d in zip(slots, digests, strict=True)
    }
