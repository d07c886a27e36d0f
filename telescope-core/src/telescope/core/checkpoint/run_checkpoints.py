"""Where a run's checkpoints live and which steps they hold, from its config alone (no runtime objects):
read by the run's checkpointing and by the health sentinel's rollback."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.checkpoint.manager import CheckpointManager
    from telescope.core.config import TelescopeConfig

__all__ = ["checkpoint_root", "checkpoint_steps", "run_checkpoint_manager"]


def checkpoint_root(cfg: TelescopeConfig) -> Path:
    """``checkpoint_dir``, or ``<run_dir>/checkpoints``."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir).expanduser().resolve()
    return Path(cfg.resolved_run_dir).resolve() / "checkpoints"


def run_checkpoint_manager(cfg: TelescopeConfig) -> CheckpointManager:
    """The run's ``CheckpointManager`` with its retention settings."""
    from telescope.core.checkpoint.manager import CheckpointManager

    return CheckpointManager(checkpoint_root(cfg), cfg.checkpoint_keep_last, cfg.checkpoint_keep_every)


def checkpoint_steps(cfg: TelescopeConfig) -> list[int]:
    """The steps of the run's complete checkpoints, oldest first."""
    return run_checkpoint_manager(cfg).steps()
