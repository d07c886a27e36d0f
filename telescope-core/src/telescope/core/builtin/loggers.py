"""Core built-in plugin: the ``local`` (always on), ``console``, ``wandb`` (``use_wandb``),
``tensorboard`` (``use_tensorboard``) and ``mlflow`` (``use_mlflow``) loggers.

Factories are import strings: rich, wandb, torch's TensorBoard writer and mlflow load only
when a run builds the logger.
``enabled_by`` names the config bool that turns a logger on (see ``observe.build``).
"""

from __future__ import annotations

import importlib.util

from telescope.core import hookimpl
from telescope.core.registry import Register

_MODULE = "telescope.core.observe.loggers"


def _missing(*modules: str, install: str | None = None) -> str | None:
    """Why a logger is unavailable (a module is not installed), or None; imports nothing.

    ``install`` is what to ``pip install`` when its name is not the first module's.
    """
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        verb = "is" if len(absent) == 1 else "are"
        return f"{' and '.join(absent)} {verb} not installed: pip install {install or modules[0]}"
    return None


@hookimpl
def telescope_register_loggers(register: Register) -> None:
    """Register local, console, wandb, tensorboard and mlflow."""
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
    register.add(
        "tensorboard",
        f"{_MODULE}.tensorboard_logger:TensorBoardLogger",
        description="TensorBoard event files: step and span-duration scalars, rollouts and eval samples as text",
        # torch.utils.tensorboard writes the files; it needs the tensorboard package.
        unavailable=_missing("tensorboard", "torch", install="tensorboard torch"),
        enabled_by="use_tensorboard",
    )
    register.add(
        "mlflow",
        f"{_MODULE}.mlflow_logger:MlflowLogger",
        description="MLflow: step metrics, config params, rollout/eval/info artifacts, run status (file store by default)",
        unavailable=_missing("mlflow", install="mlflow-skinny"),
        enabled_by="use_mlflow",
    )
