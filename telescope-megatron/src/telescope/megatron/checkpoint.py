"""Checkpoints with Megatron dist-checkpointing, plus HF weights for ``telescope checkpoint convert`` (GPU path).

Run so far only on CPU with real megatron-core 0.19.2 (one rank, fp32, plain optimizer): the
round trip restores weights, optimizer state and the next update exactly. Never run on CUDA,
with the distributed optimizer, or resharded (saved with one TP/PP, loaded with another).

Layout of a checkpoint directory:
- Megatron ``dist_checkpointing`` files of ``{"model": ..., "optimizer": ...}`` (re-shardable:
  loadable with other TP/PP sizes);
- ``trainer_state.pt`` (rank 0): LR-schedule step and counters;
- ``rng_rank_<r>.pt``: torch CPU/CUDA RNG and Megatron's model-parallel CUDA RNG tracker;
- ``meta.json``: backend, base model, vocab and padded vocab, TP/PP/EP sizes;
- ``hf/`` (when ``checkpoint_hf_weights``): ``model-XXXXX.safetensors`` + index + ``config.json``,
  written by global rank 0 from ``iter_weights_for_inference``; converting to HF is a copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from telescope.megatron.backend import MegatronBackend

__all__ = ["load", "save", "write_hf_weights"]

TRAINER_STATE = "trainer_state.pt"
SHARD_BYTES = 4 * 2**30


def save(backend: MegatronBackend, directory: str) -> None:
    """Write the checkpoint (collective: every rank calls it)."""
    from megatron.core import dist_checkpointing, tensor_parallel

    st, path = backend.require_state(), Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model_sd = st.built.gpt.sharded_state_dict()  # the bare GPTModel: keys without wrapper prefixes
    dist_checkpointing.save(
        {"model": model_sd, "optimizer": st.optimizer.sharded_state_dict(model_sd)}, str(path)
    )
    rank = dist.get_rank()
    if rank == 0:
        torch.save({"scheduler_step": st.scheduler_step, "counters": dict(st.counters)}, path / TRAINER_STATE)
        (path / "meta.json").write_text(json.dumps(_meta(backend), indent=2))
    rng = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    torch.save(rng, path / f"rng_rank_{rank}.pt")
    if backend.kwargs.checkpoint_hf_weights:
        write_hf_weights(backend, path / "hf")
    dist.barrier()


def _meta(backend: MegatronBackend) -> dict[str, Any]:
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


def write_hf_weights(backend: MegatronBackend, out: Path) -> None:
    """HF safetensors shards of the current weights (collective; rank 0 writes)."""
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
    for name, tensor in backend.iter_weights_for_inference():
        shard[name] = tensor.detach().to("cpu").contiguous()
        if sum(t.numel() * t.element_size() for t in shard.values()) >= SHARD_BYTES:
            flush()
    if dist.get_rank() == 0:
        flush()
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": index}, indent=2)
        )
        backend.require_state().built.hf_config.save_pretrained(str(out))


def load(backend: MegatronBackend, directory: str) -> None:
    """Restore model, optimizer, schedule step, counters and RNG (collective)."""
    from megatron.core import dist_checkpointing, tensor_parallel

    st, path = backend.require_state(), Path(directory)
    if not (path / TRAINER_STATE).is_file() or not (path / "meta.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Megatron checkpoint (missing {TRAINER_STATE} or meta.json); "
            "point load_checkpoint at a directory written by save_checkpoint"
        )
    model_sd = st.built.gpt.sharded_state_dict()
    template = {"model": model_sd, "optimizer": st.optimizer.sharded_state_dict(model_sd, is_loading=True)}
    loaded = dist_checkpointing.load(template, str(path))
    st.built.gpt.load_state_dict(loaded["model"])
    st.optimizer.load_state_dict(loaded["optimizer"])
    trainer_state = torch.load(path / TRAINER_STATE, weights_only=False)
    st.scheduler_step = int(trainer_state["scheduler_step"])
    st.counters.clear()
    st.counters.update(trainer_state["counters"])
    rng_file = path / f"rng_rank_{dist.get_rank()}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        torch.cuda.set_rng_state(rng["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
    dist.barrier()
