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

Protocol of one sync (``wire``): messages of up to ``weight_broadcast_bucket_mb`` each; tensors
under 4 MiB share one flat byte buffer per message, larger ones travel directly; metadata
travels once per layout (content-addressed cache on every member); every member predicts each
message's layout from the previous sync, so from the second sync on a message's header and
bucket travel in one broadcast that the receivers posted in advance; the last message is
flagged. Both ends reuse their CPU staging/receive buffers from one sync to the next (fresh
buffers cost page faults as slow as the transfer). The sender fingerprints what it sends while
the broadcasts are in flight, receivers fingerprint each payload while the next ones arrive
(the transformers engine fingerprints the parameters after loading), and ``check_sync``
compares every server's fingerprints with the sender's. ``weight_broadcast_cpu_staging`` moves
each tensor to CPU as the source yields it (frees accelerator memory; always the case with
gloo); ``weight_broadcast_pin_memory`` pins those buffers when CUDA is present (ignored on
CPU-only hosts).
"""

from __future__ import annotations

from telescope.core.weights.errors import WeightSyncError, WeightSyncMismatchError
from telescope.core.weights.settings import GroupSpec, WeightSyncSettings
from telescope.core.weights.verify import check_sync

__all__ = ["GroupSpec", "WeightSyncError", "WeightSyncMismatchError", "WeightSyncSettings", "check_sync"]
