"""Core built-in plugin: the ``local`` (always on), ``console`` and ``wandb`` (``use_wandb``) loggers.

Factories are import strings: rich and wandb load only when a run builds the logger.
``enabled_by`` names the config bool that turns a logger on (see ``observe.build``).
"""

from __future__ import annotations

import importlib.util

from telescope.core import hookimpl
from telescope.core.registry import Register

_MODULE = "telescope.core.observe"


def _missing(package: str) -> str | None:
    """Why a logger is unavailable (its package is not installed), or None; imports nothing."""
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed: pip install {package}"
    return None


@hookimpl
def telescope_register_loggers(register: Register) -> None:
    """Register local, console and wandb."""
    register.add(
        "local",
        f"{_MODULE}.local:LocalLogger",
        description="Run directory: config.yaml, run.json, metrics/system JSONL, rollout and event blocks, evals, logs",
    )
    register.add(
        "console",
        f"{_MODULE}.console:ConsoleLogger",
        description="Live progress and warnings (rich)",
        unavailable=_missing("rich"),
    )
    register.add(
        "wandb",
        f"{_MODULE}.wandb_logger:WandbLogger",
        description="Weights & Biases: step scalars, rollout tables, code and log upload",
        unavailable=_missing("wandb"),
        enabled_by="use_wandb",
    )
