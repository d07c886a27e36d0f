"""Process-group and device setup for one trainer rank (any backend)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from telescope.core.weights.group import free_port
from telescope.core.weights.store import bound_tcp_store

__all__ = ["init_process_group", "pick_device"]


def pick_device(requested: str) -> torch.device:
    """``cuda:LOCAL_RANK`` or ``cpu``; ``auto`` takes CUDA when present."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "trainer device 'cuda' was requested but CUDA is not available; use 'auto' or 'cpu'"
        )
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_process_group(device: torch.device) -> None:
    """Join the trainer group from the usual env vars (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    Already initialised: kept as is. No WORLD_SIZE in the environment: a one-rank group on a
    free local port. CUDA gets ``cpu:gloo,cuda:nccl`` so CPU-side collectives also work.
    """
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" not in os.environ:
        host, port, rank, world_size = "127.0.0.1", free_port(), 0, 1
    else:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Our own store: PyTorch's env:// rendezvous would listen on every interface (weights/store.py).
    timeout = datetime.timedelta(minutes=30)
    store = bound_tcp_store(host, port, world_size, rank == 0, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
