"""vLLM worker extension: receives Telescope weight syncs inside every vLLM worker.

Launched with ``--worker-extension-cls telescope.core.inference.vllm_engine.worker.TelescopeWeightSyncExtension``;
vLLM mixes this class into its GPU workers (no ``__init__``), and the client reaches the methods
through the dev-mode ``POST /collective_rpc`` (string arguments only, hence the JSON strings).
Each TP worker joins the group as ``rank + tp_rank`` and receives the full HF-named tensors;
``model.load_weights`` shards and fuses them the way vLLM loads a checkpoint.

Verification on vLLM covers the transport (per-tensor fingerprints of what arrived equal the
sender's); vLLM fuses parameters (e.g. ``qkv_proj``), so the per-name check of the loaded model
that the transformers engine does is not possible here.

NOT RUN HERE: this module needs vLLM and CUDA; nothing in CI imports it.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["TelescopeWeightSyncExtension"]


class TelescopeWeightSyncExtension:
    """Methods added to vLLM's worker class."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def telescope_init_weight_sync(self, request_json: str) -> dict[str, Any]:
        """Join the trainer's weight-sync group (NCCL, on this worker's GPU)."""
        from vllm.distributed import get_tensor_model_parallel_rank

        from telescope.core.inference.protocol import WeightSyncInitRequest
        from telescope.core.weights.group import WeightSyncGroup
        from telescope.core.weights.receiver import WeightReceiver
        from telescope.core.weights.settings import GroupSpec

        body = WeightSyncInitRequest.model_validate_json(request_json)
        rank = body.rank + get_tensor_model_parallel_rank()
        spec = GroupSpec(**body.model_dump(exclude={"rank"}))
        # Fresh buffers per sync (CUDA's caching allocator makes them cheap): load_weights may keep
        # references to the tensors it is given, which reused buffers would overwrite next sync.
        self._telescope_receiver = WeightReceiver(
            WeightSyncGroup(spec, rank), verify=_verify_enabled(), reuse_buffers=False
        )
        self._telescope_version = 0
        return {"rank": rank}

    def telescope_update_weights(self, version: str, apply: bool = True) -> dict[str, Any]:
        """Receive one sync straight into ``model.load_weights`` (streamed, bucket by bucket).

        ``apply=False``: receive (fingerprinting what arrived), load nothing, keep the served version.
        """
        receiver = getattr(self, "_telescope_receiver", None)
        if receiver is None:
            raise RuntimeError("no weight-sync group: call telescope_init_weight_sync first")
        # The version is checked on the first header, before load_weights sees any tensor.
        stream = receiver.receive(expect_version=int(version))
        if apply:
            self.model_runner.model.load_weights(stream)
        else:
            for _ in stream:  # take part in every broadcast; fingerprinted as they arrive
                pass
        last = receiver.last_sync
        if last is None or last.version != int(version):
            raise RuntimeError(
                f"asked to load version {version}, trainer sent {last.version if last else None}"
            )
        if apply:
            self._telescope_version = last.version
        return {
            "version": self.telescope_weight_version(),
            "received_version": last.version,
            "applied": bool(apply),
            "num_tensors": last.num_tensors,
            "fingerprints": last.received_fingerprints,
        }

    def telescope_weight_version(self) -> int:
        """The version this worker serves."""
        return int(getattr(self, "_telescope_version", 0))


def _verify_enabled() -> bool:
    path = os.environ.get("TELESCOPE_RESOLVED_CONFIG")
    if not path:
        return True
    with open(path) as fh:
        return bool(json.load(fh).get("weight_sync_verify", True))
