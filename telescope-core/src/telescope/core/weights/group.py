"""A dedicated process group for weight sync, independent of the default ``torch.distributed`` group.

The trainer's rank 0 already owns a default group (its FSDP world) and the inference
workers may own none, so the sync group is built directly from a private ``TCPStore``:
``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU. Rank 0 hosts the store.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.settings import GroupSpec
from telescope.core.weights.store import bound_tcp_store

__all__ = ["WeightSyncGroup", "device_synchronize", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def device_synchronize(device: torch.device) -> None:
    """Block until ``device`` ran everything queued on it. On NCCL a collective's ``work.wait()`` only
    makes the current CUDA stream wait for it and returns before the bytes moved, so a clock read after
    ``wait()`` alone times the launch, not the transfer. gloo's ``wait()`` returns after the transfer."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class WeightSyncGroup:
    """One member of a weight-sync group (rank 0 sends, the others receive)."""

    def __init__(self, spec: GroupSpec, rank: int) -> None:
        if not 0 <= rank < spec.world_size:
            raise ValueError(
                f"weight-sync rank {rank} is outside [0, {spec.world_size}) for group {spec.group_name!r}"
            )
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise WeightSyncError(
                "weight-sync backend 'nccl' needs CUDA; use backend 'gloo' on CPU-only hosts"
            )
        self.spec = spec
        self.rank = rank
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        try:
            base = bound_tcp_store(spec.host, spec.port, spec.world_size, rank == 0, timeout)
        except Exception as exc:  # rendezvous failures name the address and the timeout
            raise WeightSyncError(
                f"weight-sync rank {rank} could not reach the store at {spec.host}:{spec.port} "
                f"within {spec.timeout_s:.0f}s ({exc}); check ray_broadcast_init_timeout_s and the address"
            ) from exc
        self._store: Any = base  # rank 0 must keep the store alive as long as the group lives
        store = dist.PrefixStore(spec.group_name, base)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if spec.backend == "nccl"
            else torch.device("cpu")
        )
        self._pg: Any = self._make_process_group(store, rank, spec, timeout)
        # Metadata that travelled in this group, by content hash, kept by every member (see
        # wire.MetaCache). It lives on the group (not on a sender or receiver object) so that
        # every sender/receiver of the group stays in step.
        from telescope.core.weights.wire import LayoutHistory, MetaCache

        self.meta_cache = MetaCache()
        # Per message index, the layout of the previous sync (see wire.LayoutHistory): it lets
        # every member size the next sync's first buffers in advance.
        self.layouts = LayoutHistory()

    @staticmethod
    def _make_process_group(store: Any, rank: int, spec: GroupSpec, timeout: datetime.timedelta) -> Any:
        if spec.backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, spec.world_size, timeout)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, options)

    @property
    def world_size(self) -> int:
        """Members of the group (1 sender + receivers)."""
        return self.spec.world_size

    def broadcast(self, tensor: torch.Tensor) -> Any:
        """Start a broadcast of ``tensor`` from rank 0; returns the work handle (call ``.wait()``)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        return self._pg.broadcast([tensor], opts)

    def synchronize(self) -> None:
        """Wait until this member's device finished every collective issued so far (see ``device_synchronize``)."""
        device_synchronize(self.device)

    def broadcast_now(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 and wait for it."""
        self.broadcast(tensor).wait()

    def barrier(self) -> None:
        """All members meet (a one-element broadcast: works on every backend without a device map)."""
        self.broadcast_now(torch.zeros(1, dtype=torch.int64, device=self.device))

    def close(self) -> None:
        """Drop the process group and, on rank 0, the store."""
        self._pg = None
        self._store = None
