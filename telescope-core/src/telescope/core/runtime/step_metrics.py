"""Run-wide counters, and the orchestrator's part of a step's metrics: timings, async level, totals,
routing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.rollouts.batching import TrainBatch
    from telescope.core.rollouts.routing import Router

__all__ = ["Counts", "routing_metrics", "step_metrics"]


@dataclass
class Counts:
    """Run-wide counters (also what a resume needs)."""

    inference_step: int = 0
    model_version: int = 0
    completed_steps: int = 0
    discarded: Counter[str] = field(default_factory=Counter)
    zero_advantage: Counter[str] = field(default_factory=Counter)
    cancelled_samples: int = 0
    rollout_errors: int = 0
    reward_errors: Counter[str] = field(default_factory=Counter)
    """Samples whose reward raised or timed out, per environment."""
    inference_restarts: int = 0
    """Inference servers restarted after they died."""
    aborted_requests: int = 0
    """Cancelled samples' requests the servers confirmed aborting (vLLM: connections closed)."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready counters (a checkpoint's ``orchestrator_state.json``)."""
        return {
            "model_version": self.model_version,
            "completed_steps": self.completed_steps,
            "discarded": dict(self.discarded),
            "zero_advantage": dict(self.zero_advantage),
            "cancelled_samples": self.cancelled_samples,
            "rollout_errors": self.rollout_errors,
            "reward_errors": dict(self.reward_errors),
            "inference_restarts": self.inference_restarts,
            "aborted_requests": self.aborted_requests,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Counts:
        """Counters of a resumed run: batches after the checkpoint's step are generated again."""
        step = int(state["completed_steps"])
        return cls(
            inference_step=step,
            model_version=int(state["model_version"]),
            completed_steps=step,
            discarded=Counter(state["discarded"]),
            zero_advantage=Counter(state["zero_advantage"]),
            cancelled_samples=int(state["cancelled_samples"]),
            rollout_errors=int(state["rollout_errors"]),
            reward_errors=Counter(state.get("reward_errors", {})),
            inference_restarts=int(state.get("inference_restarts", 0)),
            aborted_requests=int(state.get("aborted_requests", 0)),
        )


def step_metrics(
    counts: Counts,
    batch: TrainBatch,
    trainer: dict[str, float],
    sync: dict[str, float],
    timing: dict[str, float],
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
    out["totals/aborted_requests"] = float(counts.aborted_requests)
    out["totals/rollout_errors"] = float(counts.rollout_errors)
    out["faults/inference_restarts"] = float(counts.inference_restarts)
    for env, n in counts.reward_errors.items():
        out[f"totals/reward_errors/{env}"] = float(n)
    for reason, n in counts.discarded.items():
        out[f"totals/discarded_groups/{reason}"] = float(n)
    return out


def routing_metrics(router: Router | None) -> dict[str, float]:
    """A step's routing (``sticky`` and ``sticky_least_loaded`` policies; nothing for the others):
    ``routing/moves``, requests sent away from the server holding their prefix since the previous
    step; ``routing/sticky``, those sent to it; ``routing/held_tokens_max``, the most conversation
    tokens one server holds now (compare with its prefix cache, ``Router.cache_tokens``)."""
    if router is None or router.policy not in ("sticky", "sticky_least_loaded"):
        return {}
    moves, sticky = router.take_counts()
    return {
        "routing/moves": float(moves),
        "routing/sticky": float(sticky),
        "routing/held_tokens_max": float(max(router.held_tokens(i) for i in range(router.num_servers))),
    }
