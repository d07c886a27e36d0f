"""vLLM worker extension: receives Telescope weight syncs inside every vLLM worker.

Launched with ``--worker-extension-cls telescope.core.inference.vllm_engine.worker.TelescopeWeightSyncExtension``;
vLLM mixes this class into its GPU workers (no ``__init__``), and the client reaches the methods
through ``POST /telescope/collective_rpc`` (``vllm_engine.guard``; string arguments only, hence the JSON strings).
Each TP worker joins the group as ``rank + tp_rank`` and receives the full HF-named tensors;
``model.load_weights`` shards and fuses them the way vLLM loads a checkpoint, inside vLLM's config
context and its layer-wise reload (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``),
exactly as vLLM's own ``reload_weights`` and weight-transfer ``update_weights`` do: quantized and
post-processed layers (fp8, Marlin repacking, ...) get their ``process_weights_after_loading`` again.

Verification on vLLM covers the transport (per-tensor fingerprints of what arrived equal the
sender's); vLLM fuses parameters (e.g. ``qkv_proj``), so the per-name check of the loaded model
that the transformers engine does is not possible here.

NOT RUN HERE: this module needs vLLM and CUDA; nothing in CI imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["TelescopeWeightSyncExtension"]


class TelescopeWeightSyncExtension:
    """Methods added to vLLM's worker class."""

    # Provided by the vLLM GPU worker this class is mixed into (checked by the vLLM contract tests).
    model_runner: Any
    vllm_config: Any
    model_config: Any
    device: Any

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

    def telescope_update_weights(self, version: str, apply: str = "true") -> dict[str, Any]:
        """Receive one sync straight into ``model.load_weights`` (streamed, bucket by bucket).

        ``apply="false"``: receive (fingerprinting what arrived), load nothing, keep the served version.
        Arguments are strings: ``/telescope/collective_rpc`` passes only strings.
        """
        receiver = getattr(self, "_telescope_receiver", None)
        if receiver is None:
            raise RuntimeError("no weight-sync group: call telescope_init_weight_sync first")
        apply_flag = _parse_flag("apply", apply)
        # The version is checked on the first header, before load_weights sees any tensor.
        stream = receiver.receive(expect_version=int(version))
        if apply_flag:
            self._telescope_load(stream)
        else:
            for _ in stream:  # take part in every broadcast; fingerprinted as they arrive
                pass
        last = receiver.last_sync
        if last is None or last.version != int(version):
            raise RuntimeError(
                f"asked to load version {version}, trainer sent {last.version if last else None}"
            )
        if apply_flag:
            self._telescope_version = last.version
        return {
            "version": self.telescope_weight_version(),
            "received_version": last.version,
            "applied": apply_flag,
            "num_tensors": last.num_tensors,
            "fingerprints": last.received_fingerprints,
        }

    def _telescope_load(self, weights: Iterator[tuple[str, Any]]) -> None:
        """``model.load_weights`` the way vLLM reloads checkpoint-format weights in place."""
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model = self.model_runner.model
        with set_current_vllm_config(self.vllm_config), torch.device(self.device):
            initialize_layerwise_reload(model)
            model.load_weights(weights)
            finalize_layerwise_reload(model, self.model_config)

    def telescope_weight_version(self) -> int:
        """The version this worker serves."""
        return int(getattr(self, "_telescope_version", 0))


def _parse_flag(name: str, value: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise ValueError(f"telescope_update_weights: {name}={value!r}; send the string 'true' or 'false'")


def _verify_enabled() -> bool:
    path = os.environ.get("TELESCOPE_RESOLVED_CONFIG")
    if not path:
        return True
    with open(path) as fh:
        return bool(json.load(fh).get("weight_sync_verify", True))
