"""Turning an eval's completions into metrics and per-sample rows.

- Every metric: mean over all valid completions (a failed request is no completion; it is
  counted in ``errors``). A completion whose scoring failed lacks the eval's metrics: it
  counts 0 for them (it did not pass).
- A completion an infrastructure failure ended after its retries (``infra_cause``) is no
  completion either: left out of every metric and pass@k, counted in ``infra_masked`` (not in
  ``errors``); ``infra_retried`` counts the attempts run again.
- pass@k / pass^k per sample with the unbiased estimator over *all* its valid completions
  (c = completions with value > 0), averaged over the samples that have at least k.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from telescope.core.env.passk import sample_pass_k

__all__ = ["CompletionOutcome", "EvalResult", "aggregate", "flat_metrics"]

log = logging.getLogger("telescope.evals")
SCORING_FAILURE_KEYS = ("reward_error", "reward_timeout")


@dataclass
class CompletionOutcome:
    """One completion of one eval sample (or the error that replaced it)."""

    text: str = ""
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    num_tokens: int = 0
    infra_cause: str | None = None
    """The infrastructure failure that ended it after its retries (then ``error`` says what failed)."""
    infra_retries: int = 0
    """Attempts an infrastructure failure ended before this outcome."""

    @property
    def valid(self) -> bool:
        return self.error is None


@dataclass
class EvalResult:
    """One eval at one step: ``metrics`` without the ``eval/<name>/`` prefix, one row per sample."""

    name: str
    step: int
    metrics: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)


def flat_metrics(results: list[EvalResult]) -> dict[str, float]:
    """``{"eval/<name>/<metric>": value}`` over all ``results``."""
    return {f"eval/{r.name}/{key}": value for r in results for key, value in r.metrics.items()}


def _pass_metrics(family: Any, keys: list[str], name: str) -> list[str]:
    if family.metrics is None:
        return [k for k in keys if k not in SCORING_FAILURE_KEYS]
    missing = [m for m in family.metrics if m not in keys]
    if missing and keys:
        log.warning(
            "eval %s: pass_k metrics %s are not reported by this eval (it reports %s)", name, missing, keys
        )
    return [m for m in family.metrics if m in keys]


def _values(outcomes: list[CompletionOutcome], metric: str) -> list[float]:
    return [float(o.metrics.get(metric, 0.0)) for o in outcomes if o.valid]


def _row(index: int, prompt: str, answer: str, outcomes: list[CompletionOutcome]) -> dict[str, Any]:
    return {
        "sample_index": index,
        "prompt": prompt,
        "answer": answer,
        "completions": [o.text for o in outcomes],
        "rewards": [o.reward for o in outcomes],
        "metrics": [dict(o.metrics) for o in outcomes],
        "finish_reasons": [o.finish_reason for o in outcomes],
        "completion_tokens": [o.num_tokens for o in outcomes],
        "errors": [o.error for o in outcomes],
    }


def aggregate(
    name: str,
    step: int,
    pass_k: Any,
    samples: list[tuple[int, str, str]],
    outcomes: list[list[CompletionOutcome]],
) -> EvalResult:
    """Metrics and rows of one eval; ``samples[i] = (dataset index, prompt text, answer)``."""
    valid = [o for per_sample in outcomes for o in per_sample if o.valid]
    keys = sorted({k for o in valid for k in o.metrics})
    metrics: dict[str, float] = {}
    for key in keys:
        metrics[key] = sum(_values(valid, key)) / len(valid)
    rows = [_row(i, p, a, outs) for (i, p, a), outs in zip(samples, outcomes, strict=True)]
    for kind, symbol, family in (("at", "@", pass_k.at_k), ("pow", "^", pass_k.pow_k)):
        for metric in _pass_metrics(family, keys, name):
            for k in family.k:
                label = f"pass{symbol}{k}/{metric}"
                per_sample = [sample_pass_k(_values(outs, metric), k, kind=kind) for outs in outcomes]
                for row, value in zip(rows, per_sample, strict=True):
                    row[label] = value
                scored = [v for v in per_sample if v is not None]
                if scored:
                    metrics[label] = sum(scored) / len(scored)
    metrics["num_samples"] = float(len(samples))
    metrics["num_completions"] = float(len(valid))
    every = [o for per_sample in outcomes for o in per_sample]
    metrics["errors"] = float(sum(not o.valid and o.infra_cause is None for o in every))
    metrics["infra_masked"] = float(sum(o.infra_cause is not None for o in every))
    metrics["infra_retried"] = float(sum(o.infra_retries for o in every))
    return EvalResult(name, step, metrics, rows)
