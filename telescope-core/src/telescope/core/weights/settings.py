"""Settings of a weight sync, read from the resolved run config (no heavy imports)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = [
    "DIRECT_TENSOR_BYTES",
    "GroupSpec",
    "WeightSyncSettings",
    "choose_broadcast_host",
    "new_group_name",
    "serving_dtype",
]

#: In flattened_bucket mode a tensor at least this large (or larger than the bucket) is
#: broadcast directly. Measured on gloo (2 cores, 1 sender -> 2 receivers, 21 rounds side by
#: side, % of a raw broadcast of the same bytes): 20M model 1 MiB 84%, 4 MiB 97%, 16 MiB 91%,
#: everything bucketed 92%; 100M model 92% / 101% / 91% / 89%. Copying a large tensor into the
#: bucket costs a memcpy on the critical path (the CPU is the bottleneck of a loopback transfer),
#: while the fixed cost of its own broadcast overlaps with the payloads already in flight; small
#: tensors are the opposite (latency-bound).
DIRECT_TENSOR_BYTES = 4 << 20


def serving_dtype(cfg: TelescopeConfig) -> str:
    """The dtype servers run in and weights travel in: ``inference_dtype``, else the trainer's
    compute dtype (``mixed_precision_dtype``, else ``model_dtype``). Master weights stay in
    ``model_dtype`` on the trainer."""
    return str(cfg.inference_dtype or cfg.mixed_precision_dtype or cfg.model_dtype)


class WeightSyncSettings(BaseModel):
    """How weights travel; every field comes from a run-config field of the same meaning."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mode: Literal["flattened_bucket", "per_tensor"] = "flattened_bucket"
    """weight_broadcast_mode: copy small tensors into one flat buffer per bucket (tensors of 4 MiB or more
    go directly), or broadcast every tensor as itself (no copies, one broadcast per tensor)."""
    bucket_mb: int = Field(default=256, ge=1)
    """weight_broadcast_bucket_mb: bytes of tensors per message (one header and metadata per message)."""
    cpu_staging: bool = False
    """weight_broadcast_cpu_staging: move each tensor to CPU as soon as the source yields it."""
    pin_memory: bool = True
    """weight_broadcast_pin_memory: pinned CPU staging buffers (only with CUDA; ignored on CPU-only hosts)."""
    verify: bool = True
    """weight_sync_verify: fingerprint both sides of every sync; a mismatch raises naming the tensors."""
    dtype: str | None = None
    """inference_dtype (resolved, see ``serving_dtype``): floating-point tensors are cast to it on the
    sender as they are staged, bucket by bucket (None: sent as the trainer holds them)."""
    direct_tensor_mb: float | None = Field(default=None, ge=0)
    """flattened_bucket: tensors of at least this many MiB travel directly instead of in a bucket
    (None: ``DIRECT_TENSOR_BYTES``, 4 MiB, chosen from measurements; mostly for benchmarks)."""

    @property
    def bucket_bytes(self) -> int:
        """Bucket capacity in bytes."""
        return self.bucket_mb * (1 << 20)

    def direct_tensor_bytes(self) -> int:
        """In flattened_bucket mode, tensors of at least this many bytes travel directly (see
        ``DIRECT_TENSOR_BYTES``)."""
        if self.direct_tensor_mb is not None:
            return min(int(self.direct_tensor_mb * (1 << 20)), self.bucket_bytes)
        return min(DIRECT_TENSOR_BYTES, self.bucket_bytes)

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> WeightSyncSettings:
        """Read the settings from a ``TelescopeConfig`` (or anything with the same attributes)."""
        return cls(
            mode=cfg.weight_broadcast_mode,
            bucket_mb=cfg.weight_broadcast_bucket_mb,
            cpu_staging=cfg.weight_broadcast_cpu_staging,
            pin_memory=cfg.weight_broadcast_pin_memory,
            verify=cfg.weight_sync_verify,
            dtype=serving_dtype(cfg),
        )


class GroupSpec(BaseModel):
    """Rendezvous of one weight-sync group: rank 0 is the trainer, ranks 1.. the inference workers."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    host: str
    """Address of the TCP store, hosted by rank 0 (127.0.0.1 on one node)."""
    port: int = Field(ge=1, le=65535)
    """Port of the TCP store."""
    world_size: int = Field(ge=2)
    """1 sender + the number of receiving workers."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """gloo (CPU tensors) or nccl (CUDA tensors)."""
    group_name: str = "telescope-weights"
    """Prefix of the store keys, so several groups can share a store port over time."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Rendezvous and per-collective timeout (a run sets ray_broadcast_init_timeout_s)."""


def new_group_name() -> str:
    """A fresh weight-sync group name, ``telescope-weights-<32 hex digits>``: the prefix of the group's
    store keys, drawn by the driver for each group it forms. A process that reaches the store's port
    but not the driver's announcement cannot take a rank in the rendezvous (servers join only groups
    named so: ``inference.protocol.WeightSyncInitRequest``)."""
    import secrets

    return f"telescope-weights-{secrets.token_hex(16)}"


def choose_broadcast_host(trainer_ip: str, server_ips: list[str], prefer_loopback: bool) -> str:
    """The store address: 127.0.0.1 when everything is on the trainer's node and loopback is preferred.

    Ray reports a node's routable IP, which is slower than loopback for a one-node sync
    (``ray_broadcast_prefer_loopback_if_single_node``).
    """
    if prefer_loopback and all(ip == trainer_ip for ip in server_ips):
        return "127.0.0.1"
    return trainer_ip
