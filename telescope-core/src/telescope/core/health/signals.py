"""What the health rules read from one step: trainer metrics and statistics of its rollouts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from telescope.core.observe.metrics import LENGTH_STOP_REASONS
from telescope.core.observe.rundir.records import RolloutRecord

__all__ = ["MIN_PROMPTS_FOR_MODE", "MODEL_OUTCOMES", "StepSignals", "mode_share", "step_signals"]

#: Trainer metrics that must be finite (``nonfinite`` names the ones that are not).
FINITE_METRICS = ("loss", "grad_norm", "entropy", "kl_divergence_inference")

#: Discard reasons of rollouts the model finished (kept ones have None): what it wrote, even if
#: not trained on. Cancelled, failed and too-long-prompt rollouts say nothing about the policy.
MODEL_OUTCOMES = (None, "zero_advantage", "max_async")

MIN_PROMPTS_FOR_MODE = 4
"""A step with fewer distinct prompts has no degenerate-output share (one prompt, one answer is fine)."""


@dataclass(frozen=True)
class StepSignals:
    """One step's signals; None = the step has no such value (the rules reading it skip the step)."""

    step: int
    entropy: float | None = None
    kl: float | None = None
    """``kl_divergence_inference``: trainer vs the sampler's logprobs of the same tokens."""
    grad_norm: float | None = None
    completion_tokens: float | None = None
    """Mean completion length (tokens) of the step's finished rollouts, trained on or not."""
    truncated_share: float | None = None
    """Share of those that stopped at the token limit."""
    mode_share: float | None = None
    """Share of the step's distinct prompts whose rollouts include its most common completion."""
    mode_text: str = ""
    nonfinite: tuple[str, ...] = ()
    """Trainer metrics that are NaN or infinite, and ``skipped_nonfinite_steps`` when the trainer skipped one."""


def _finite(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if value is not None and math.isfinite(value) else None


def _nonfinite(metrics: Mapping[str, float]) -> tuple[str, ...]:
    bad = [k for k in FINITE_METRICS if k in metrics and not math.isfinite(metrics[k])]
    if metrics.get("train/skipped_nonfinite_steps", 0.0) > 0:
        bad.append("train/skipped_nonfinite_steps")
    return tuple(bad)


def mode_share(rows: Sequence[RolloutRecord]) -> tuple[float | None, str]:
    """``(share, text)``: the step's most common completion and the share of its distinct prompts
    that produced it; ``(None, "")`` with fewer than ``MIN_PROMPTS_FOR_MODE`` distinct prompts."""
    prompts = {r.prompt_text for r in rows}
    if len(prompts) < MIN_PROMPTS_FOR_MODE:
        return None, ""
    text, _ = Counter(r.completion_text.strip() for r in rows).most_common(1)[0]
    producing = {r.prompt_text for r in rows if r.completion_text.strip() == text}
    return len(producing) / len(prompts), text


def step_signals(step: int, metrics: Mapping[str, float], rollouts: Sequence[RolloutRecord]) -> StepSignals:
    """The signals of ``step`` from its ``telescope_step_end`` arguments."""
    rows = [r for r in rollouts if r.discard_reason in MODEL_OUTCOMES]
    lengths = [r.completion_tokens for r in rows] if rows else []
    truncated = sum(r.stop_reason in LENGTH_STOP_REASONS for r in rows)
    share, text = mode_share(rows)
    return StepSignals(
        step=step,
        entropy=_finite(metrics, "entropy"),
        kl=_finite(metrics, "kl_divergence_inference"),
        grad_norm=_finite(metrics, "grad_norm"),
        completion_tokens=sum(lengths) / len(lengths) if lengths else None,
        truncated_share=truncated / len(rows) if rows else None,
        mode_share=share,
        mode_text=text,
        nonfinite=_nonfinite(metrics),
    )
