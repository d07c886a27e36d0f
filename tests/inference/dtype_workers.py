"""Process entry point of the serving-dtype test (imported by name in spawned children)."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from telescope.core.weights import GroupSpec, WeightSyncSettings
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.sender import WeightSender


def master_weights() -> list[tuple[str, torch.Tensor]]:
    """float32 master weights (bucketed and direct sizes) and an integer buffer that must stay as is."""
    gen = torch.Generator().manual_seed(5)
    return [
        ("embed.weight", torch.randn(40, 33, generator=gen)),
        ("norm.weight", 1 + 1e-3 * torch.randn(33, generator=gen)),  # below bf16 resolution near 1
        ("positions", torch.arange(7)),
        ("big.weight", torch.randn(700, 1000, generator=gen)),
    ]


def cast_worker(rank: int, port: int, dtype: str, queue: Any) -> None:
    """Rank 0 sends ``master_weights`` with ``WeightSyncSettings(dtype=...)``; rank 1 reports what arrived."""
    torch.set_num_threads(1)
    group = WeightSyncGroup(GroupSpec(host="127.0.0.1", port=port, world_size=2, timeout_s=120), rank)
    if rank == 0:
        report = WeightSender(group, WeightSyncSettings(bucket_mb=1, dtype=dtype)).send(
            iter(master_weights()), 1
        )
        queue.put(("sent", report.num_bytes, report.fingerprints))
        return
    receiver = WeightReceiver(group)
    got = {name: tensor.clone() for name, tensor in receiver.receive_all().items()}
    assert receiver.last_sync is not None
    # Plain bytes through the queue: shared-memory tensors would not outlive this process.
    queue.put(("got", pickle.dumps(got), receiver.last_sync.received_fingerprints))
