"""Checkpoints: sharded model + optimizer via torch.distributed.checkpoint, plus trainer state.

Layout of a checkpoint directory:
- ``.metadata`` and ``__<rank>_0.distcp``: DCP files of ``{"model": ..., "optimizer": ...}``;
  model keys are Hugging Face names, so the files convert offline to safetensors;
- ``trainer_state.pt`` (rank 0): LR scheduler state and step counters;
- ``rng_rank_<r>.pt``: each rank's torch RNG state.
Writing to a temporary name and renaming is the caller's job (the orchestrator owns naming).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from telescope.fsdp.steps import TrainState

__all__ = ["load", "save"]

TRAINER_STATE = "trainer_state.pt"


def save(st: TrainState, directory: str, rank: int) -> None:
    """Write the checkpoint (collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(st.model, st.optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path))
    if rank == 0:
        torch.save(
            {"scheduler": st.scheduler.state_dict(), "counters": dict(st.counters)}, path / TRAINER_STATE
        )
    torch.save({"torch": torch.get_rng_state()}, path / f"rng_rank_{rank}.pt")
    dist.barrier()


def load(st: TrainState, directory: str, rank: int) -> None:
    """Restore model, optimizer, scheduler, counters and RNG (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(directory)
    if not (path / ".metadata").is_file() or not (path / TRAINER_STATE).is_file():
        raise FileNotFoundError(
            f"{path} is not an FSDP checkpoint (missing .metadata or {TRAINER_STATE}); "
            "point load_checkpoint at a directory written by save_checkpoint"
        )
    model_sd, optim_sd = get_state_dict(st.model, st.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        st.model, st.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    trainer_state = torch.load(path / TRAINER_STATE, weights_only=False)
    st.scheduler.load_state_dict(trainer_state["scheduler"])
    st.counters.clear()
    st.counters.update(trainer_state["counters"])
    rng_file = path / f"rng_rank_{rank}.pt"
    if rng_file.is_file():
        torch.set_rng_state(torch.load(rng_file, weights_only=False)["torch"])
    dist.barrier()
