"""Nested config entries: environments and evals."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


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


class PassKEntry(BaseModel):
    """One pass@k family: which metrics, which k values.

    A list is shorthand for ``{k: [...]}`` (every metric), so ``at_k: [1, 4]`` works.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    metrics: list[str] | None = None
    """Metrics to compute it for; a completion passes when the metric is > 0. null = every
    metric the eval reports (except reward_error / reward_timeout)."""
    k: list[int] = Field(default_factory=list)
    """The k values (each >= 1); an eval draws max(k) completions per sample."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            return {"k": list(data)}
        if isinstance(data, int) and not isinstance(data, bool):
            return {"k": [data]}
        return data

    @field_validator("k")
    @classmethod
    def _check_k(cls, ks: list[int]) -> list[int]:
        bad = [k for k in ks if isinstance(k, bool) or k < 1]
        if bad:
            raise ValueError(f"k values must be integers >= 1, got {bad}; e.g. k: [1, 4]")
        return sorted(set(ks))

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, metrics: list[str] | None) -> list[str] | None:
        if metrics is not None and (not metrics or any(not m.strip() for m in metrics)):
            raise ValueError(
                f"metrics must be non-empty metric names (or null = every metric), got {metrics}"
            )
        return metrics


class PassKConfig(BaseModel):
    """pass@k (at_k: any of k draws passes) and pass^k (pow_k: all k draws pass).

    Both use the unbiased estimator over all n completions of a sample (n = the largest k).
    ``pass_k: [1, 4]`` is shorthand for ``{at_k: {k: [1, 4]}}`` over every metric.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    at_k: PassKEntry = Field(default_factory=PassKEntry)
    """pass@k: probability that at least one of k completions passes (``pass@{k}/{metric}``)."""
    pow_k: PassKEntry = Field(default_factory=PassKEntry)
    """pass^k: probability that all k completions pass (``pass^{k}/{metric}``)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, (list, tuple)):
            return {"at_k": {"k": list(data)}}
        if not isinstance(data, (dict, PassKConfig)):
            raise ValueError(
                f"pass_k must be a mapping {{at_k: {{metrics, k}}, pow_k: {{metrics, k}}}} or a list of k "
                f"values like [1, 4], got {data!r}"
            )
        return data

    @property
    def max_k(self) -> int:
        """Completions to draw per sample: the largest k (at least 1)."""
        return max([1, *self.at_k.k, *self.pow_k.k])


class EvalEntry(BaseModel):
    """One eval in the ``evals`` list."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    name: str
    """Eval name: a registered eval (e.g. math500) or any registered environment."""
    eval_every: int = Field(default=10, ge=1)
    """Run this eval every N training steps."""
    num_samples: int = Field(default=-1, ge=-1)
    """Number of samples to evaluate; -1 = the full dataset (0 is rejected: nothing to evaluate)."""
    separate_eval_samples: bool = False
    """Reserve the first num_samples samples for eval and exclude them from training."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Environment-specific keyword arguments, validated by the eval's kwargs model."""
    pass_k: PassKConfig = Field(default_factory=dict, validate_default=True)  # seed default {}: no pass@k
    """pass@k / pass^k: {at_k: {metrics: [correct], k: [1, 4]}, pow_k: {k: [4]}}; a list [1, 4]
    is shorthand for at_k.k over every metric the eval reports; {} = none (one completion per sample)."""

    @field_validator("pass_k", mode="before")
    @classmethod
    def _pass_k_input(cls, data: Any) -> Any:
        # EvalEntry is strict; build the nested model here so dicts and the list shorthand pass.
        return data if isinstance(data, PassKConfig) else PassKConfig.model_validate(data)

    @field_validator("num_samples")
    @classmethod
    def _some_samples(cls, value: int) -> int:
        if value == 0:
            raise ValueError(
                "num_samples 0 leaves nothing to evaluate: use -1 for the whole dataset or N > 0"
            )
        return value

    temperature: float | None = Field(default=None, ge=0)
    """Override the sampling temperature (null = inherit from the training config)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Override nucleus sampling (null = inherit)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Override max tokens (null = inherit)."""
