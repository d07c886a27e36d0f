"""``EvalRunConfig``: the schema of ``telescope eval EVAL.yaml`` (every field has a default but ``evals``).

What to evaluate: ``checkpoints`` (explicit ``{path, step}``, native or HF), every committed
``step_<N>`` under ``checkpoint_dir``, and/or a plain HF ``model`` (folder or hub name) at
``model_step``. Explicit checkpoints override discovered ones of the same step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from telescope.core.config import TelescopeConfig
from telescope.core.config.entries import EvalEntry
from telescope.core.config.errors import ConfigError, problems_from_validation_error
from telescope.core.config.schema import Dtype

__all__ = ["CheckpointRef", "EvalRunConfig", "check_eval_names", "load_eval_run_config", "training_config"]


class CheckpointRef(BaseModel):
    """One checkpoint to evaluate."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str
    """A native step_<N> folder (converted to HF on the fly) or a Hugging Face model folder."""
    step: int = Field(ge=0)
    """Training step the results are recorded at."""


class EvalRunConfig(BaseModel):
    """``telescope eval`` settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    evals: list[EvalEntry] = Field(min_length=1)
    """The evals (same entries as the training config's ``evals``; eval_every is ignored)."""
    checkpoints: list[CheckpointRef] = Field(default_factory=list)
    """Explicit checkpoints ``{path, step}`` (native or HF)."""
    checkpoint_dir: str | None = None
    """Evaluate every committed step_<N> under this folder (a run's checkpoints/)."""
    model: str | None = None
    """A plain HF model (folder or hub name) to evaluate at ``model_step``."""
    model_step: int = Field(default=0, ge=0)
    """Step recorded for ``model``."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (an eval entry's own value wins)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling (null = off; an eval entry's own value wins)."""
    max_tokens: int = Field(default=3700, ge=1)
    """Max tokens per completion (an eval entry's own value wins)."""
    max_model_len: int = Field(default=4096, ge=2)
    """Context length of the inference servers."""
    model_dtype: Dtype = "float32"
    """Precision the servers load and run the weights in (bfloat16 halves GPU memory; the
    training run's own model_dtype is the natural choice)."""
    enable_thinking: bool = False
    """Pass enable_thinking=True to the chat template."""
    chat_template: str | None = None
    """Jinja chat template replacing the tokenizer's own."""
    seed: int = 0
    """Seed of every request's sampling seed (an eval repeats exactly)."""
    inference_engine: Literal["auto", "vllm", "transformers"] = "auto"
    """Engine (auto = vllm with a CUDA GPU, else transformers)."""
    inference_engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific options, validated by the engine's kwargs model."""
    inference_num_workers: int = Field(default=1, ge=1)
    """Inference servers to launch per checkpoint."""
    inference_host: str = "127.0.0.1"
    """Host the servers listen on."""
    inference_base_port: int = Field(default=8100, ge=1, le=65535)
    """Server i listens on inference_base_port + i."""
    max_concurrent_prompts_per_server: int = Field(default=32, ge=1)
    """Requests in flight per server."""
    run_dir: str | None = None
    """Where results go (evals/metrics.jsonl, evals/samples.jsonl); null = the parent of
    checkpoint_dir (the training run's folder), else runs/eval."""
    use_wandb: bool = False
    """Log eval/<name>/<metric> to W&B at each checkpoint's step."""
    wandb_project: str = "telescope"
    """W&B project (a new run, unless wandb_run_path is set)."""
    wandb_run_path: str | None = None
    """entity/project/run_id of the training run to resume and log into."""

    @model_validator(mode="after")
    def _something_to_evaluate(self) -> EvalRunConfig:
        if not (self.checkpoints or self.checkpoint_dir or self.model):
            raise ValueError("nothing to evaluate: set checkpoints, checkpoint_dir or model")
        if self.wandb_run_path is not None and len(self.wandb_run_path.split("/")) != 3:
            raise ValueError(f"wandb_run_path must be entity/project/run_id, got {self.wandb_run_path!r}")
        return self

    @property
    def resolved_run_dir(self) -> Path:
        if self.run_dir:
            return Path(self.run_dir)
        return Path(self.checkpoint_dir).resolve().parent if self.checkpoint_dir else Path("runs/eval")


def load_eval_run_config(path: str | Path, overrides: dict[str, Any] | None = None) -> EvalRunConfig:
    """Read and validate an eval YAML; any problem is one ``ConfigError`` naming field and value."""
    from telescope.core.config.dotted import apply_overrides
    from telescope.core.config.loader import load_yaml_file

    data = apply_overrides(load_yaml_file(path), overrides or {})
    try:
        return EvalRunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation_error(exc), source=str(path)) from None


def training_config(run: EvalRunConfig, model: str, engine: str) -> TelescopeConfig:
    """A full run config for the servers and the ``EvalRunner`` (the rest keeps its defaults)."""
    fields = {
        name: getattr(run, name)
        for name in (
            "temperature",
            "top_p",
            "max_tokens",
            "max_model_len",
            "model_dtype",
            "enable_thinking",
            "chat_template",
            "seed",
            "inference_engine_kwargs",
            "inference_num_workers",
            "inference_host",
            "inference_base_port",
            "max_concurrent_prompts_per_server",
        )
    }
    # `environments` needs one entry; nothing trains, so the first eval's name stands in.
    return TelescopeConfig.model_validate(
        {
            **fields,
            "inference_dtype": run.model_dtype,  # servers load the checkpoint in model_dtype
            "model": model,
            "inference_engine": engine,
            "run_dir": str(run.resolved_run_dir),
            "use_wandb": False,
            "evals": [e.model_dump() for e in run.evals],
            "environments": [{"name": run.evals[0].name}],
        }
    )


def check_eval_names(run: EvalRunConfig, registry: Any) -> None:
    """Every eval is a registered eval or environment and its kwargs fit; else one ``ConfigError``."""
    from telescope.core.registry import did_you_mean

    valid = sorted({*registry.names("eval"), *registry.names("environment")})
    problems: list[str] = []
    for i, entry in enumerate(run.evals):
        kind = "eval" if registry.has("eval", entry.name) else "environment"
        if not registry.has(kind, entry.name):
            problems.append(
                f"evals[{i}].name: unknown eval '{entry.name}'.{did_you_mean(entry.name, valid)} "
                f"Registered evals and environments: {', '.join(valid) or '(none)'}"
            )
            continue
        try:
            registry.get(kind, entry.name).validate_kwargs(entry.kwargs)
        except ValidationError as exc:
            problems += problems_from_validation_error(exc, prefix=f"evals[{i}].kwargs.")
        except TypeError as exc:
            problems.append(f"evals[{i}].kwargs: {exc}")
    if problems:
        raise ConfigError(problems)
