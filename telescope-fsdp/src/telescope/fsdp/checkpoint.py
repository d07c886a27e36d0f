"""FSDP checkpoints: sharded model (+ optimizer) via torch.distributed.checkpoint, plus trainer state.

Files written into the checkpoint folder (names in ``telescope.core.checkpoint.layout``):

- ``.metadata`` and ``__<rank>_0.distcp``: DCP files of ``{"model": ...}``, plus
  ``"optimizer"`` when ``training_state``; model keys are Hugging Face names, so the files
  convert offline (``telescope checkpoint convert``); a tied parameter is stored once, under
  its first name (``model.embed_tokens.weight``, not ``lm_head.weight``);
- ``trainer_state.pt`` (rank 0): ``step`` (completed training steps = scheduler steps),
  counters and, with training state, the LR scheduler's state;
- ``rng_rank_<r>.pt``: each rank's python/numpy/torch(/CUDA) RNG states;
- ``hf_meta/`` (rank 0): the base model's HF config, generation config and tokenizer;
- ``trainer_meta.json`` (rank 0, after every other file): backend, base model, step, world
  size and whether training state was saved; with LoRA also ``lora`` (the adapter settings).

With LoRA (``lora_rank > 0``) the model part holds the adapter tensors only (the frozen base is
``base_model``, loaded again at start-up), and the optimizer part only their state.

On load the LR scheduler is always put at the saved step with the *current* run's schedule
(``base_lr * lr_lambda(step)``, ``base_lr`` the current ``learning_rate``), so the next step uses
exactly the LR the uninterrupted run would have used, or the lowered one of a health rollback. A weights-only checkpoint loaded with ``training_state=True`` gets a fresh
optimizer (warned). Atomic naming is ``CheckpointManager``'s job.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from telescope.core.checkpoint import layout
from telescope.core.checkpoint.rng import load_rng_states, save_rng_states

if TYPE_CHECKING:
    from telescope.fsdp.steps import TrainState

__all__ = ["load", "save", "set_scheduler_step", "tied_aliases"]

logger = logging.getLogger(__name__)


def save(st: TrainState, directory: str, rank: int, *, training_state: bool = True) -> None:
    """Write the checkpoint (collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if training_state:
        model_sd, optim_sd = get_state_dict(st.model, st.optimizer)
        dcp.save({"model": _saved_part(st, model_sd), "optimizer": optim_sd}, checkpoint_id=str(path))
    else:
        dcp.save({"model": _saved_part(st, get_model_state_dict(st.model))}, checkpoint_id=str(path))
    save_rng_states(path, rank)
    step = int(st.scheduler.last_epoch)

    def trainer_state() -> dict[str, Any]:
        state: dict[str, Any] = {"step": step, "counters": dict(st.counters)}
        if training_state:
            state["scheduler"] = st.scheduler.state_dict()
        return state

    def meta() -> dict[str, Any]:
        described: dict[str, Any] = {
            "backend": "fsdp",
            "base_model": st.cfg.model,
            "step": step,
            "training_state": training_state,
            "world_size": dist.get_world_size(),
            "model_dtype": st.cfg.model_dtype,
        }
        if st.cfg.lora_rank > 0:  # an adapter-only checkpoint: the base model is meta's base_model
            from telescope.core.weights.lora import lora_config_dict

            described["lora"] = lora_config_dict(st.cfg)
        return described

    layout.write_trainer_files(path, rank, st.cfg.model, trainer_state, meta)


def load(st: TrainState, directory: str, rank: int, *, training_state: bool = True) -> dict[str, Any]:
    """Restore the checkpoint (collective); returns ``{"step", "training_state"}``."""
    path = Path(directory)
    _check_is_fsdp_checkpoint(path)
    saved_training_state = bool(layout.read_trainer_meta(path).get("training_state", True))
    restore_optimizer = training_state and saved_training_state
    _load_weights(st, path, with_optimizer=restore_optimizer)
    trainer_state = layout.read_trainer_state(path)
    step = int(trainer_state["step"])
    if training_state:
        if not saved_training_state:
            logger.warning(layout.weights_only_warning(path, step))
            st.optimizer.state.clear()
        if "scheduler" in trainer_state and restore_optimizer:
            # this run's base LR stays (a health rollback lowers it; a resume may change learning_rate)
            current = {
                "lr_lambdas": [None] * len(st.optimizer.param_groups),
                "base_lrs": list(st.scheduler.base_lrs),
            }
            st.scheduler.load_state_dict({**trainer_state["scheduler"], **current})
        set_scheduler_step(st.scheduler, step)
        st.counters.clear()
        st.counters.update(trainer_state["counters"])
        load_rng_states(path, rank)
    dist.barrier()
    return {"step": step, "training_state": restore_optimizer}


def _check_is_fsdp_checkpoint(path: Path) -> None:
    if not (path / ".metadata").is_file() or not (path / layout.TRAINER_STATE).is_file():
        raise FileNotFoundError(
            f"{path} is not an FSDP checkpoint (missing .metadata or {layout.TRAINER_STATE}); "
            "point load_checkpoint at a directory written by save_checkpoint"
        )
    backend = layout.read_trainer_meta(path).get("backend", "fsdp")
    if backend != "fsdp":
        raise ValueError(
            f"{path} was written by the {backend!r} trainer backend; load it with train_backend: {backend}"
        )


def _load_weights(st: TrainState, path: Path, *, with_optimizer: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    aliases = tied_aliases(st.model)
    lora = st.cfg.lora_rank > 0
    _check_lora_matches(path, lora)
    options = StateDictOptions(strict=not lora)  # LoRA: the adapters only, the base stays as loaded
    if with_optimizer:
        model_sd, optim_sd = get_state_dict(st.model, st.optimizer)
        state: dict[str, Any] = {"model": _saved_part(st, model_sd), "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        model_sd = state["model"] if lora else _with_aliases(state["model"], aliases)
        set_state_dict(
            st.model,
            st.optimizer,
            model_state_dict=model_sd,
            optim_state_dict=state["optimizer"],
            options=options,
        )
    else:
        state = {"model": _saved_part(st, get_model_state_dict(st.model))}
        dcp.load(state, checkpoint_id=str(path))
        model_sd = state["model"] if lora else _with_aliases(state["model"], aliases)
        set_model_state_dict(st.model, model_sd, options=options)


def _saved_part(st: TrainState, model_sd: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds of the model: the adapters with LoRA, else every tensor (tied ones once)."""
    if st.cfg.lora_rank > 0:
        from telescope.core.weights.lora import is_adapter_name

        return {k: v for k, v in model_sd.items() if is_adapter_name(k)}
    return _drop(model_sd, tied_aliases(st.model))


def _check_lora_matches(path: Path, lora: bool) -> None:
    """A LoRA checkpoint resumes only a LoRA run, a full one only a full run (no silent half-loads)."""
    saved = layout.read_trainer_meta(path).get("lora")
    if lora and not saved:
        raise ValueError(
            f"{path} is a full-model checkpoint but this run has lora_rank > 0; resume it with "
            "lora_rank: 0, or start the LoRA run in a new run directory"
        )
    if saved and not lora:
        raise ValueError(
            f"{path} is a LoRA checkpoint (rank {saved.get('r')}) but this run has lora_rank: 0; "
            f"resume it with lora_rank: {saved.get('r')}"
        )


def tied_aliases(model: Any) -> dict[str, str]:
    """``{alias: first name}`` for parameters registered under two names (tied embeddings):
    the tensor is stored once, under its first name, as in a Hugging Face checkpoint."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def _drop(state: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in aliases}


def _with_aliases(state: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    return {**state, **{alias: state[first] for alias, first in aliases.items() if first in state}}


def set_scheduler_step(scheduler: Any, step: int) -> None:
    """Put a ``LambdaLR`` at ``step`` completed steps and set each group's LR for the next one."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        raise TypeError(f"set_scheduler_step supports LambdaLR schedulers, got {type(scheduler).__name__}")
    lrs = [base_lr * fn(step) for fn, base_lr in zip(lambdas, scheduler.base_lrs, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler.last_epoch = step
    scheduler._last_lr = list(lrs)
