"""Checkpoints with Megatron dist-checkpointing, plus HF weights for ``telescope checkpoint convert`` (GPU path).

Run so far only on CPU with real megatron-core 0.19.2 (one rank, fp32, plain optimizer): the
round trip restores weights, optimizer state and the next update exactly. Never run on CUDA,
with the distributed optimizer, or resharded (saved with one TP/PP, loaded with another).
The weights-only paths (``training_state=False`` on save or load) have not run at all: the
session that wrote them had no megatron-core.

Layout of a checkpoint directory (shared names: ``telescope.core.checkpoint.layout``):
- Megatron ``dist_checkpointing`` files of ``{"model": ...}`` plus ``"optimizer"`` with
  training state (re-shardable: loadable with other TP/PP sizes);
- ``trainer_state.pt`` (rank 0): step (= LR-schedule step) and counters;
- ``rng_rank_<r>.pt``: python/numpy/torch/CUDA RNG (core helpers) plus, as the extra entry
  ``tracker``, Megatron's model-parallel CUDA RNG tracker;
- ``hf_meta/`` (rank 0): the base model's HF config, generation config and tokenizer;
- ``trainer_meta.json`` (rank 0, last): backend, base model, step, training_state, vocab and
  padded vocab, TP/PP/EP sizes;
- ``hf/`` (when ``checkpoint_hf_weights``): ``model-XXXXX.safetensors`` + index + ``config.json``,
  written by global rank 0 from ``iter_hf_weights`` (experts per expert); converting to HF is a copy
  (``telescope.megatron.convert.write_hf_weights``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from telescope.core.checkpoint.layout import (
    TRAINER_META,
    TRAINER_STATE,
    read_trainer_meta,
    read_trainer_state,
    weights_only_warning,
    write_trainer_files,
)
from telescope.core.checkpoint.rng import load_rng_states, save_rng_states
from telescope.megatron.mapping.rules import ExpertLayout

if TYPE_CHECKING:
    from collections.abc import Iterator

    from telescope.megatron.options import MegatronBackendKwargs
    from telescope.megatron.parallel import ParallelLayout

__all__ = ["CheckpointedBackend", "load", "save", "save_hf_weights"]


class CheckpointedBackend(Protocol):
    """What checkpoints need of a Megatron backend (``MegatronBackend`` is one; this module never
    imports it, so backend -> checkpoint is the only import between the two)."""

    kwargs: MegatronBackendKwargs
    layout: ParallelLayout

    def require_state(self) -> Any: ...

    def iter_hf_weights(
        self, dtype: torch.dtype | None = None, *, expert_layout: ExpertLayout = "per_expert"
    ) -> Iterator[tuple[str, torch.Tensor]]: ...


logger = logging.getLogger(__name__)

SHARD_BYTES = 4 * 2**30


def save(backend: CheckpointedBackend, directory: str, *, training_state: bool = True) -> None:
    """Write the checkpoint (collective: every rank calls it)."""
    from megatron.core import dist_checkpointing, tensor_parallel

    st, path = backend.require_state(), Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model_sd = st.built.gpt.sharded_state_dict()  # the bare GPTModel: keys without wrapper prefixes
    state: dict[str, Any] = {"model": model_sd}
    if training_state:
        state["optimizer"] = st.optimizer.sharded_state_dict(model_sd)
    dist_checkpointing.save(state, str(path))
    rank = dist.get_rank()
    save_rng_states(path, rank, extra={"tracker": tensor_parallel.get_cuda_rng_tracker().get_states()})
    if backend.kwargs.checkpoint_hf_weights:
        save_hf_weights(backend, path / "hf")
    write_trainer_files(
        path,
        rank,
        st.cfg.model,
        lambda: {"step": st.scheduler_step, "counters": dict(st.counters)},
        lambda: {**_meta(backend), "step": st.scheduler_step, "training_state": training_state},
    )


def _meta(backend: CheckpointedBackend) -> dict[str, Any]:
    st, layout = backend.require_state(), backend.layout
    return {
        "backend": "megatron",
        "base_model": st.cfg.model,
        "vocab_size": st.built.spec.vocab_size,
        "padded_vocab_size": st.built.padded_vocab,
        "tensor_parallel_size": layout.tensor,
        "pipeline_parallel_size": layout.pipeline,
        "expert_parallel_size": layout.expert,
    }


def save_hf_weights(backend: CheckpointedBackend, out: Path) -> None:
    """HF safetensors shards of the current weights (collective; rank 0 writes), MoE experts per
    expert as on the hub (transformers 4 and 5 and vLLM all load that layout)."""
    from safetensors.torch import save_file

    shard: dict[str, torch.Tensor] = {}
    index: dict[str, str] = {}
    files = 0

    def flush() -> None:
        nonlocal shard, files
        if shard:
            files += 1
            name = f"model-{files:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard = {}

    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    for name, tensor in backend.iter_hf_weights(expert_layout="per_expert"):
        shard[name] = tensor.detach().to("cpu").contiguous()
        if sum(t.numel() * t.element_size() for t in shard.values()) >= SHARD_BYTES:
            flush()
    if dist.get_rank() == 0:
        flush()
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": index}, indent=2)
        )
        backend.require_state().built.hf_config.save_pretrained(str(out))


def load(backend: CheckpointedBackend, directory: str, *, training_state: bool = True) -> dict[str, Any]:
    """Restore model (+ optimizer), schedule step, counters and RNG (collective);
    returns ``{"step", "training_state"}``."""
    from megatron.core import dist_checkpointing, tensor_parallel

    st, path = backend.require_state(), Path(directory)
    meta = read_trainer_meta(path)
    if not (path / TRAINER_STATE).is_file() or meta.get("backend") != "megatron":
        raise FileNotFoundError(
            f"{path} is not a Megatron checkpoint (missing {TRAINER_STATE}, or {TRAINER_META} does not say "
            "megatron); point load_checkpoint at a directory written by save_checkpoint"
        )
    restore_optimizer = training_state and bool(meta.get("training_state", True))
    model_sd = st.built.gpt.sharded_state_dict()
    template: dict[str, Any] = {"model": model_sd}
    if restore_optimizer:
        template["optimizer"] = st.optimizer.sharded_state_dict(model_sd, is_loading=True)
    loaded = dist_checkpointing.load(template, str(path))
    st.built.gpt.load_state_dict(loaded["model"])
    if restore_optimizer:
        st.optimizer.load_state_dict(loaded["optimizer"])
    trainer_state = read_trainer_state(path)
    step = int(trainer_state["step"])
    if training_state:
        if not restore_optimizer:
            logger.warning(weights_only_warning(path, step))
            _fresh_optimizer(st.optimizer)
        st.scheduler_step = step
        st.counters.clear()
        st.counters.update(trainer_state["counters"])
        extra = load_rng_states(path, dist.get_rank())
        if extra and "tracker" in extra:
            tensor_parallel.get_cuda_rng_tracker().set_states(extra["tracker"])
    dist.barrier()
    return {"step": step, "training_state": restore_optimizer}


def _fresh_optimizer(optimizer: Any) -> None:
    """Drop optimizer moments and re-copy fp32 main params from the just-loaded model params."""
    if hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for opt in chained:
        inner = getattr(opt, "optimizer", opt)
        inner.state.clear()
