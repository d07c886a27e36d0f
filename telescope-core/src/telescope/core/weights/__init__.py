"""In-place weight sync: trainer rank 0 broadcasts to every inference worker, verified by fingerprints.

Layout (heavy modules import torch; this package's ``__init__`` and ``settings``/``errors`` do not):

- ``settings``: ``WeightSyncSettings`` (from the run config) and ``GroupSpec`` (rendezvous).
- ``group``: a dedicated process group (gloo on CPU, NCCL on GPU) built from a private TCP
  store, so it never touches (or needs) the default ``torch.distributed`` group.
- ``wire``: the message format shared by both sides.
- ``sender`` / ``receiver``: the two ends; ``load``: copy received tensors into a model.
- ``fingerprint``: per-tensor fingerprints (xxh3 of the bytes).
- ``verify``: ``check_sync`` compares the sender's fingerprints with every server's; a mismatch
  raises ``WeightSyncMismatchError`` naming the tensors (light: the orchestrator calls it).

Protocol of one sync (``wire``): messages of up to ``weight_broadcast_bucket_mb`` each, a header
then the payloads; small tensors share one flat byte buffer, tensors of 1 MiB or more travel
directly; metadata travels once per layout (content-addressed cache on every member); the last
message is flagged, and with verification one int64 buffer of the sender's digests follows it.
Both ends reuse their CPU staging/receive buffers from one sync to the next (fresh buffers cost
page faults as slow as the transfer). Receivers fingerprint each payload while the next ones are
in flight and check the transport; the transformers engine also checks what landed in the model. ``weight_broadcast_cpu_staging`` moves each tensor to CPU as the source yields
it (frees accelerator memory; always the case with gloo); ``weight_broadcast_pin_memory`` pins
those buffers when CUDA is present (ignored on CPU-only hosts).
"""

from __future__ import annotations

from telescope.core.weights.errors import WeightSyncError, WeightSyncMismatchError
from telescope.core.weights.settings import GroupSpec, WeightSyncSettings
from telescope.core.weights.verify import check_sync

__all__ = ["GroupSpec", "WeightSyncError", "WeightSyncMismatchError", "WeightSyncSettings", "check_sync"]
