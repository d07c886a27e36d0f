"""Nested config entries: environments and evals."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class EnvironmentEntry(BaseModel):
    """One training environment in the ``environments`` list."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    name: str
    """Environment name (must match a registered environment)."""
    weight: float = Field(default=1.0, gt=0)
    """Sampling weight for multi-environment training (must be > 0)."""
    reward_min: float | None = None
    """Expected minimum reward; with reward_max, rewards are normalised to [0, 1] before advantages."""
    reward_max: float | None = None
    """Expected maximum reward; with reward_min, rewards are normalised to [0, 1] before advantages."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Environment-specific keyword arguments, validated by the environment's kwargs model."""


class EvalEntry(BaseModel):
    """One eval in the ``evals`` list."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    name: str
    """Eval name: a registered eval (e.g. math500) or any registered environment."""
    eval_every: int = Field(default=10, ge=1)
    """Run this eval every N training steps."""
    num_samples: int = Field(default=-1, ge=-1)
    """Number of samples to evaluate; -1 = the full dataset."""
    separate_eval_samples: bool = False
    """Reserve the first num_samples samples for eval and exclude them from training."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Environment-specific keyword arguments, validated by the eval's kwargs model."""
    pass_k: dict[str, Any] = Field(default_factory=dict)
    """pass@k / pass^k configuration, e.g. {at_k: [1, 4], pow_k: [4]}."""
    temperature: float | None = Field(default=None, ge=0)
    """Override the sampling temperature (null = inherit from the training config)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Override nucleus sampling (null = inherit)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Override max tokens (null = inherit)."""
