"""The orchestrator's part of a step's metrics: timings, async level and run-wide totals."""

from __future__ import annotations

from typing import Any

__all__ = ["step_metrics"]


def step_metrics(
    counts: Any, batch: Any, trainer: dict[str, float], sync: dict[str, float], timing: dict[str, float]
) -> dict[str, float]:
    """Trainer, weight-sync and batch metrics plus ``timing_*``, ``async_level`` and ``totals/*``.

    ``timing`` holds ``timing_step_total`` (since the previous step ended) and
    ``timing_waiting_for_data`` (the trainer idle, waiting for this batch).
    """
    out = dict(trainer)
    out.update(sync)
    out.update(batch.metrics)
    out.update(timing)
    out["timing_step_active"] = timing["timing_step_total"] - timing["timing_waiting_for_data"]
    out["async_level"] = float(counts.inference_step - counts.model_version)
    out["totals/cancelled_samples"] = float(counts.cancelled_samples)
    out["totals/rollout_errors"] = float(counts.rollout_errors)
    out["faults/inference_restarts"] = float(counts.inference_restarts)
    for env, n in counts.reward_errors.items():
        out[f"totals/reward_errors/{env}"] = float(n)
    for reason, n in counts.discarded.items():
        out[f"totals/discarded_groups/{reason}"] = float(n)
    return out
