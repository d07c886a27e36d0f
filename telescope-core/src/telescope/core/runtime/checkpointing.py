"""A run's checkpoints: when to save, what goes in, and how a resumed run picks them up.

A checkpoint directory (``<checkpoint_dir>/step_<N>``, committed atomically by
``telescope.core.checkpoint.CheckpointManager``) holds the trainer's files (sharded model,
optimizer, LR scheduler, RNG states, ``hf_meta/``) and, from the driver:

- ``orchestrator_state.json``: counters and the prompt ledger (scheduler position plus every
  prompt drawn but not yet trained on, re-queued on resume);
- ``config.yaml``: the resolved run config;
- ``loggers.json``: each logger's run ids (W&B continues the same run).

Everything is written into the partial directory *before* the commit renames it, so a crash
at any point leaves either the complete new checkpoint or none of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.checkpoint.run_checkpoints import checkpoint_root, checkpoint_steps
from telescope.core.checkpoint.run_checkpoints import run_checkpoint_manager as _manager
from telescope.core.errors import describe_failure, exception_chain
from telescope.core.observe.rundir.records import TimelineEvent

if TYPE_CHECKING:
    from telescope.core.checkpoint import CheckpointManager
    from telescope.core.config import TelescopeConfig
    from telescope.core.runtime.orchestrator import Orchestrator
    from telescope.core.runtime.ray_group import RayTrainerGroup

__all__ = ["ResumePoint", "RunCheckpointer", "checkpoint_root", "checkpoint_steps", "find_resume_point"]

log = logging.getLogger("telescope.checkpoint")

ORCHESTRATOR_STATE = "orchestrator_state.json"
RUN_CONFIG = "config.yaml"
LOGGER_IDS = "loggers.json"


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resumed run continues from."""

    path: Path
    step: int
    orchestrator_state: dict[str, Any]
    logger_ids: dict[str, Any]


def find_resume_point(cfg: TelescopeConfig) -> ResumePoint | None:
    """The checkpoint ``resume_from_checkpoint`` names (None when not resuming); clear error if absent."""
    if cfg.resume_from_checkpoint is False:
        return None
    mgr = _manager(cfg)
    path = Path(mgr.resolve(cfg.resume_from_checkpoint))
    state_file = path / ORCHESTRATOR_STATE
    if not state_file.is_file():
        from telescope.core.config import ConfigError

        raise ConfigError(
            [
                f"resume_from_checkpoint: {path} has no {ORCHESTRATOR_STATE}, so it was not written by a "
                "training run (a converted or hand-made folder?); resume from a step_N folder of checkpoint_dir"
            ]
        )
    ids_file = path / LOGGER_IDS
    return ResumePoint(
        path=path,
        step=int(mgr.read_meta(path)["step"]),
        orchestrator_state=json.loads(state_file.read_text()),
        logger_ids=json.loads(ids_file.read_text()) if ids_file.is_file() else {},
    )


def supersede_later_checkpoints(cfg: TelescopeConfig, resume: ResumePoint) -> list[Path]:
    """A resume from an older step: move the newer checkpoints aside (they belong to the old history)."""
    moved = _manager(cfg).set_aside_after(resume.step)
    if moved:
        log.warning(
            "resuming from step %d: moved the later checkpoints %s to %s (kept, not deleted; "
            "this run writes its own from step %d on)",
            resume.step,
            ", ".join(p.name for p in moved),
            moved[0].parent,
            resume.step + 1,
        )
    return moved


@dataclass(eq=False)
class RunCheckpointer:
    """Saves a checkpoint after the steps ``checkpoint_every`` names (and the last step)."""

    cfg: TelescopeConfig
    trainer: RayTrainerGroup
    logger_ids: Callable[[], dict[str, Any]]
    """Each logger's run ids, saved in ``loggers.json`` (W&B continues the same run)."""
    warn: Callable[[str], None]
    fail: Callable[[BaseException], None] | None = None
    """Ends the run at once (``RunSession.fail``); the error is raised from ``after_step`` as well."""
    mgr: CheckpointManager = field(init=False)
    failures: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.mgr = _manager(self.cfg)
        removed = self.mgr.cleanup_partials()
        if removed:
            log.info("removed %s unfinished checkpoint folder(s) left by an interrupted save", removed)

    async def after_step(self, orchestrator: Orchestrator, step: int) -> None:
        """Save when due; the orchestrator state is taken now, before anything else can change it."""
        from telescope.core.checkpoint import checkpoint_due

        if checkpoint_due(step, self.cfg.checkpoint_every, self.cfg.number_of_steps):
            await self.checkpoint(orchestrator, step)

    async def checkpoint(self, orchestrator: Orchestrator, step: int) -> Path | None:
        """Save ``step`` now, inside a ``checkpoint`` span; the committed folder, or None (``save``)."""
        state = orchestrator.state_dict()
        orchestrator.emit(TimelineEvent("checkpoint", "start", step=step))
        try:
            path = await self.save(step, state)
        except BaseException as exc:  # the span ends, saying why, however the save stopped (a cancel too)
            error = "cancelled" if isinstance(exc, asyncio.CancelledError) else describe_failure(exc)
            failed = {"path": "", "ok": False, "error": error}
            orchestrator.emit(TimelineEvent("checkpoint", "end", step=step, attrs=failed))
            raise
        end = TimelineEvent(
            "checkpoint", "end", step=step, attrs={"path": str(path or ""), "ok": path is not None}
        )
        orchestrator.emit(end)
        return path

    async def save(self, step: int, state: dict[str, Any]) -> Path | None:
        """Write and commit ``step_<step>``; two attempts, then ``checkpoint_failure`` decides.

        ``stop`` (default): raise ``StorageError`` (and ``fail``) naming the folder and the cause;
        ``warn``: a loud warning and training goes on without this checkpoint. Either way the
        previous checkpoint is intact (a save is committed by one rename, or not at all).
        """
        for attempt in (1, 2):
            partial = self.mgr.begin(step)
            try:
                start = time.perf_counter()
                await self.trainer.save_checkpoint(str(partial), self.cfg.checkpoint_save_training_state)
                self._write_driver_files(Path(partial), state)
                final = Path(self.mgr.commit(partial, step, meta=self._meta()))
                log.info("checkpoint step %d saved to %s in %.1f s", step, final, time.perf_counter() - start)
                return final
            except Exception as exc:  # retried once, then checkpoint_failure decides
                self.mgr.abort(partial)
                if _trainer_died(exc):
                    raise  # not a storage fault: the driver's trainer recovery decides
                log.warning("checkpoint step %d, attempt %d failed: %s", step, attempt, exc)
                error = exc
        self.failures += 1
        self._failed(step, error)
        return None

    def _failed(self, step: int, error: Exception) -> None:
        from telescope.core.observe.rundir.storage import StorageError, describe_os_error

        steps = self.mgr.steps()
        previous = (
            f"the previous checkpoint {self.mgr.path(steps[-1])} is intact"
            if steps
            else "no earlier checkpoint"
        )
        what = f"checkpoint at step {step} could not be written to {self.mgr.path(step)}: {describe_os_error(error)}"
        if self.cfg.checkpoint_failure == "warn":
            self.warn(f"{what}; training continues without it (checkpoint_failure: warn), {previous}")
            return None
        failure = StorageError(
            f"{what}; {previous}. Free space and resume, or set checkpoint_failure: warn "
            "to train on without checkpoints"
        )
        failure.__cause__ = error
        if self.fail is not None:
            self.fail(failure)
        raise failure

    def _write_driver_files(self, directory: Path, state: dict[str, Any]) -> None:
        from telescope.core.config import config_to_yaml

        (directory / ORCHESTRATOR_STATE).write_text(json.dumps(state, indent=1))
        (directory / RUN_CONFIG).write_text(config_to_yaml(self.cfg))
        (directory / LOGGER_IDS).write_text(json.dumps(self.logger_ids(), indent=1, default=str))

    def _meta(self) -> dict[str, Any]:
        return {
            "base_model": self.cfg.model,
            "backend": self.cfg.train_backend,
            "training_state": bool(self.cfg.checkpoint_save_training_state),
        }


def _trainer_died(exc: BaseException) -> bool:
    """Whether a save failed because a trainer rank's process died: a Ray actor error, also when it
    comes wrapped (a ``RayTaskError`` of a rank that called the dead one, ``raise ... from``)."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # no Ray: trainers are in this process
        return False
    return any(isinstance(e, RayActorError) for e in exception_chain(exc))
