"""The receiving end of a weight sync (one per inference worker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.fingerprint import compare_fingerprints, fingerprint
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.wire import HEADER_LEN, OP_END, OP_TENSORS, MessageMeta, dtype_from_name

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

    ``receive()`` yields ``(name, tensor)`` as messages arrive (tensors live on the group's
    device and are views of freshly allocated buffers, safe to keep). When the sender's end
    message arrives, the transport is verified: the fingerprints of what arrived must equal the
    sender's, else ``WeightSyncMismatchError`` names the tensors.
    """

    def __init__(self, group: WeightSyncGroup, *, verify: bool = True) -> None:
        if group.rank == 0:
            raise ValueError(
                "WeightReceiver cannot be rank 0 of its weight-sync group (rank 0 is the sender)"
            )
        self.group = group
        self.verify = verify
        self._meta_cache: list[MessageMeta] = group.meta_cache  # per message index, see group
        self.last_sync: ReceivedSync | None = None

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield every tensor of the next sync, then verify it (see the class docstring)."""
        received: dict[str, str] = {}
        count = 0
        header_work, header = self._post_header()
        while True:
            header_work.wait()
            op, meta_nbytes, version, index = (int(v) for v in header.cpu().tolist())
            if op == OP_END:
                self._finish(self._blob(meta_nbytes), version, count, received)
                del self._meta_cache[index:]
                return
            if op != OP_TENSORS:
                raise WeightSyncError(
                    f"weight-sync protocol error: unknown message op {op} (message {index})"
                )
            meta = self._message_meta(meta_nbytes, index)
            payload_works, tensors = self._post_payloads(meta)
            # Post the next header now: collectives match in issue order, and this hides its latency.
            header_work, header = self._post_header()
            for work in payload_works:
                work.wait()
            for name, tensor in tensors:
                if self.verify:
                    received[name] = fingerprint(tensor)
                count += 1
                yield name, tensor

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

    def _message_meta(self, meta_nbytes: int, index: int) -> MessageMeta:
        if meta_nbytes == 0:
            if index >= len(self._meta_cache):
                raise WeightSyncError(
                    f"weight-sync protocol error: message {index} reuses metadata never received"
                )
            return self._meta_cache[index]
        meta = MessageMeta.decode(self._blob(meta_nbytes))
        if index < len(self._meta_cache):
            self._meta_cache[index] = meta
        else:
            self._meta_cache.append(meta)
        return meta

    def _post_payloads(self, meta: MessageMeta) -> tuple[list[Any], list[tuple[str, torch.Tensor]]]:
        """Post the receives of one message; the tensors are valid once the works are done."""
        device = self.group.device
        flat = torch.empty(meta.flat_nbytes, dtype=torch.uint8, device=device) if meta.flat else None
        direct = [torch.empty(slot.nbytes, dtype=torch.uint8, device=device) for slot in meta.direct]
        works = ([self.group.broadcast(flat)] if flat is not None else []) + [
            self.group.broadcast(b) for b in direct
        ]
        out = []
        for slot in meta.flat:
            assert flat is not None
            raw = flat[slot.offset : slot.offset + slot.nbytes]
            out.append((slot.name, raw.view(dtype_from_name(slot.dtype)).view(slot.shape)))
        for slot, raw in zip(meta.direct, direct, strict=True):
            out.append((slot.name, raw.view(dtype_from_name(slot.dtype)).view(slot.shape)))
        return works, out

    def _finish(self, blob: bytes, version: int, count: int, received: dict[str, str]) -> None:
        end = json.loads(blob)
        if int(end["count"]) != count:
            raise WeightSyncError(
                f"weight sync v{version}: sender sent {end['count']} tensors, received {count}"
            )
        sender = end.get("fingerprints")
        self.last_sync = ReceivedSync(version, count, sender, received if self.verify else None)
        if self.verify and sender is not None:
            compare_fingerprints(
                sender, received, where=f"transport, version {version}, rank {self.group.rank}"
            )
