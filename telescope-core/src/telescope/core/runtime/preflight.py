"""Checks before anything starts: features this release cannot run are refused, never ignored."""

from __future__ import annotations

from typing import Any

from telescope.core.config import ConfigError

__all__ = ["unsupported_problems"]


def unsupported_problems(cfg: Any) -> list[str]:
    """Fields set to values whose feature is not part of this release (each names the fix)."""
    problems = []
    if cfg.evals:
        problems.append(
            "evals: evaluations during training are not implemented in this release yet; remove the `evals` "
            "list (eval_before_training / eval_after_training then have nothing to run)"
        )
    if cfg.checkpoint_every:
        problems.append(
            f"checkpoint_every: {cfg.checkpoint_every} — checkpointing is not implemented in this release yet; "
            "set checkpoint_every: false"
        )
    if cfg.resume_from_checkpoint is not False:
        problems.append(
            "resume_from_checkpoint: resuming is not implemented in this release yet; set it to false"
        )
    if cfg.use_wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            problems.append(
                "use_wandb: true but wandb is not installed; `pip install wandb` or set use_wandb: false"
            )
    return problems


def check_supported(cfg: Any) -> None:
    """Raise ``ConfigError`` listing every unsupported setting."""
    problems = unsupported_problems(cfg)
    if problems:
        raise ConfigError(problems)
