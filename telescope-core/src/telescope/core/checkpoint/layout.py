"""File names inside a native checkpoint folder, and telling native from Hugging Face folders.

A native checkpoint folder (``step_<N>``) holds:

- the trainer's files: for FSDP the DCP files ``.metadata`` + ``__<rank>_0.distcp`` of
  ``{"model": <HF-named tensors>, "optimizer": ...}``; for Megatron its ``dist_checkpointing``
  files and ``hf/`` (HF weights written at save time);
- ``trainer_state.pt``: step, counters and (with training state) the LR scheduler;
- ``trainer_meta.json``: backend, base model, whether training state was saved, world size;
- ``rng_rank_<r>.pt``: each rank's RNG states;
- ``hf_meta/``: the base model's HF config, generation config and tokenizer files;
- the driver's files (``orchestrator_state.json``, ``config.yaml``, ...) and, written last
  by ``CheckpointManager.commit``, ``meta.json``.
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "HF_META_DIR",
    "TRAINER_META",
    "TRAINER_STATE",
    "checkpoint_backend",
    "is_hf_checkpoint",
    "is_native_checkpoint",
    "read_trainer_meta",
    "read_trainer_state",
    "rng_file",
    "weights_only_warning",
    "write_trainer_files",
]

TRAINER_STATE = "trainer_state.pt"
TRAINER_META = "trainer_meta.json"
HF_META_DIR = "hf_meta"
DCP_METADATA = ".metadata"
HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def rng_file(directory: str | Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its RNG states."""
    return Path(directory) / f"rng_rank_{rank}.pt"


def read_trainer_meta(directory: str | Path) -> dict[str, Any]:
    """``trainer_meta.json`` of a checkpoint folder ({} when absent)."""
    file = Path(directory) / TRAINER_META
    if not file.is_file():
        return {}
    data: dict[str, Any] = json.loads(file.read_text())
    return data


def read_trainer_state(directory: str | Path) -> dict[str, Any]:
    """``trainer_state.pt`` of a checkpoint folder (step, counters, LR scheduler state), read as data.

    ``torch.load(weights_only=True)``: tensors and plain Python containers only, so a crafted file
    cannot run code when a checkpoint someone sent is resumed or converted.
    """
    import pickle

    import torch

    file = Path(directory) / TRAINER_STATE
    try:
        state: dict[str, Any] = torch.load(file, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{file} holds more than tensors and plain data, so it is not loaded (it could run code): it was "
            f"not written by Telescope's trainers, or was altered; {str(exc).splitlines()[0]}"
        ) from None
    return state


def is_native_checkpoint(path: str | Path) -> bool:
    """A folder written by a Telescope trainer's ``save_checkpoint``."""
    path = Path(path)
    return path.is_dir() and (path / TRAINER_META).is_file()


def is_hf_checkpoint(path: str | Path) -> bool:
    """A Hugging Face model folder (``config.json`` plus weights) that ``from_pretrained`` loads."""
    path = Path(path)
    return (path / "config.json").is_file() and any((path / name).is_file() for name in HF_WEIGHT_FILES)


def checkpoint_backend(path: str | Path) -> str:
    """``fsdp`` / ``megatron`` / ... as recorded by the trainer; raises when ``path`` is not native."""
    meta = read_trainer_meta(path)
    if not meta.get("backend"):
        raise ValueError(
            f"{path} is not a Telescope checkpoint (no {TRAINER_META}); give a step_<N> folder written by training"
        )
    return str(meta["backend"])


def weights_only_warning(path: str | Path, step: int) -> str:
    """What a trainer logs when it resumes training from a weights-only checkpoint."""
    return f"{path} is a weights-only checkpoint: optimizer state starts fresh, LR schedule continues at step {step}"


def write_trainer_files(
    path: Path,
    rank: int,
    base_model: str,
    trainer_state: Callable[[], dict[str, Any]],
    meta: Callable[[], dict[str, Any]],
) -> None:
    """The end of a trainer backend's save, once each rank wrote its own files (collective).

    Rank 0 writes ``trainer_state.pt`` (``trainer_state()``) and ``hf_meta/`` (``base_model``'s), then,
    when every rank is there, ``trainer_meta.json`` (``meta()``): the description that marks the
    trainer's files done.
    """
    import torch
    import torch.distributed as dist

    from telescope.core.checkpoint.hf_meta import write_hf_meta

    if rank == 0:
        torch.save(trainer_state(), path / TRAINER_STATE)
        write_hf_meta(base_model, path / HF_META_DIR)
    dist.barrier()  # every rank's files are written before the description that marks them done
    if rank == 0:
        (path / TRAINER_META).write_text(json.dumps(meta(), indent=2))
    dist.barrier()
