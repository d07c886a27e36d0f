"""Per-step rollout metrics, computed from the step's ``RolloutRecord`` list.

Input: every rollout record of one trainer step — kept (``discard_reason`` None), discarded
(``DISCARD_REASONS`` or any other reason) and cancelled (``off_policy`` / ``eval_drain``).
Reward, advantage, sample-metric, token and group metrics use the kept rollouts (the
samples the trainer saw); the ``discarded/*`` and ``cancelled/*`` sections use the others.
A prompt group is the rollouts sharing ``(step, group_id)``. Key names follow the
section/group/metric convention; the full list is in ``docs/run-directory.md``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from telescope.core.observe.rundir.records import (
    CANCEL_REASONS,
    DISCARD_REASONS,
    ZERO_ADVANTAGE_KINDS,
    RolloutRecord,
    zero_advantage_kind,
)
from telescope.core.observe.stats import gini, max_median_ratio, summary

__all__ = ["LENGTH_STOP_REASONS", "perf_metrics", "rollout_metrics"]

#: Finish reasons that mean "hit the token limit" (OpenAI ``length``; our multi-turn ``truncated``).
LENGTH_STOP_REASONS = ("length", "truncated")


def _prefixed(prefix: str, stats: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": v for k, v in stats.items()}


def _groups(rows: Iterable[RolloutRecord]) -> list[list[RolloutRecord]]:
    by_key: dict[tuple[int, int], list[RolloutRecord]] = defaultdict(list)
    for r in rows:
        by_key[(r.step, r.group_id)].append(r)
    return list(by_key.values())


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _value_metrics(prefix: str, groups: list[list[float]]) -> dict[str, float]:
    """mean/std/min/max over all values plus the per-group Gini averaged over groups."""
    flat = [v for g in groups for v in g]
    out = _prefixed(prefix, summary(flat))
    if flat:
        out[f"{prefix}/gini_mean"] = _mean([gini(g) for g in groups])
    return out


def _raw(record: RolloutRecord) -> float:
    """The reward as the environment returned it."""
    return record.reward if record.raw_reward is None else record.raw_reward


def _reward_metrics(
    prefix: str, groups: list[list[RolloutRecord]], value: Callable[[RolloutRecord], float]
) -> dict[str, float]:
    """``{prefix}/mean|std|min|max|gini_mean`` and, with several environments, ``{prefix}/{env}/...``."""
    out = _value_metrics(prefix, [[value(r) for r in g] for g in groups])
    kept = [r for g in groups for r in g]
    envs = sorted({r.env for r in kept})
    if len(envs) > 1:
        for env in envs:
            out.update(_prefixed(f"{prefix}/{env}", summary([value(r) for r in kept if r.env == env])))
    return out


def _kept_metrics(kept: list[RolloutRecord]) -> dict[str, float]:
    groups = _groups(kept)
    out = _reward_metrics("reward", groups, _raw)
    if any(_raw(r) != r.reward for r in kept):  # a declared range normalised some rewards
        out.update(_reward_metrics("reward_normalized", groups, lambda r: r.reward))
    out.update(_prefixed("advantage", summary([r.advantage for r in kept])))
    names = sorted({k for r in kept for k in r.sample_metrics})
    for name in names:
        per_group = [[float(r.sample_metrics[name]) for r in g if name in r.sample_metrics] for g in groups]
        out.update(_value_metrics(f"sample_metrics/{name}", [g for g in per_group if g]))
    out.update(_length_metrics("tokens", kept))
    if kept:
        lengths = [[float(r.completion_tokens) for r in g] for g in groups]
        hit = sum(r.stop_reason in LENGTH_STOP_REASONS for r in kept)
        out["rollouts/count"] = float(len(kept))
        out["rollouts/groups"] = float(len(groups))
        out["rollouts/stop_reason_length_pct"] = 100.0 * hit / len(kept)
        out["rollouts/group_length_gini_mean"] = _mean([gini(g) for g in lengths])
        ratios = [x for x in (max_median_ratio(g) for g in lengths) if x is not None]
        if ratios:
            out["rollouts/group_length_max_median_ratio_mean"] = _mean(ratios)
    return out


def _length_metrics(prefix: str, rows: list[RolloutRecord]) -> dict[str, float]:
    out = _prefixed(f"{prefix}/prompt", summary([float(r.prompt_tokens) for r in rows]))
    out.update(_prefixed(f"{prefix}/completion", summary([float(r.completion_tokens) for r in rows])))
    out.update(
        _prefixed(f"{prefix}/total", summary([float(r.prompt_tokens + r.completion_tokens) for r in rows]))
    )
    return out


def _discard_metrics(discarded: list[RolloutRecord], n_finished: int) -> dict[str, float]:
    counts = Counter(str(r.discard_reason) for r in discarded)
    out = {"discarded/count": float(len(discarded))}
    out["discarded/pct"] = 100.0 * len(discarded) / n_finished if n_finished else 0.0
    for reason in [*DISCARD_REASONS, *sorted(set(counts) - set(DISCARD_REASONS))]:
        out[f"discarded/{reason}/count"] = float(counts.get(reason, 0))
        out[f"discarded/{reason}/pct"] = 100.0 * counts.get(reason, 0) / n_finished if n_finished else 0.0
    zero = [r for r in discarded if r.discard_reason == "zero_advantage"]
    kinds = Counter(
        g[0].zero_advantage_kind or zero_advantage_kind([r.reward for r in g]) for g in _groups(zero)
    )
    for kind in ZERO_ADVANTAGE_KINDS:
        out[f"discarded/zero_advantage/{kind}_groups"] = float(kinds.get(kind, 0))
    if zero:
        out["discarded/zero_advantage/reward_mean"] = _mean([r.reward for r in zero])
    out.update(_length_metrics("discarded/tokens", discarded))
    return out


def _reward_error_metrics(rows: Sequence[RolloutRecord]) -> dict[str, float]:
    """``reward/<env>/errors``: rollouts of each environment whose reward raised or timed out."""
    out: dict[str, float] = {}
    for r in rows:
        failed = (
            r.sample_metrics.get("reward_error", 0.0) > 0 or r.sample_metrics.get("reward_timeout", 0.0) > 0
        )
        key = f"reward/{r.env}/errors"
        out[key] = out.get(key, 0.0) + float(failed)
    return out


def rollout_metrics(rows: Sequence[RolloutRecord], extra_cancelled: int = 0) -> dict[str, float]:
    """All rollout-derived step metrics for one step's records.

    Args:
        rows: the step's records (kept, discarded and cancelled together).
        extra_cancelled: cancellations the caller counted without making a record for them.
    """
    kept = [r for r in rows if r.discard_reason is None]
    cancelled = [r for r in rows if r.discard_reason in CANCEL_REASONS]
    discarded = [r for r in rows if r.discard_reason is not None and r.discard_reason not in CANCEL_REASONS]
    out = _kept_metrics(kept)
    out.update(_discard_metrics(discarded, len(kept) + len(discarded)))
    out.update(_reward_error_metrics(rows))
    cancel_counts = Counter(r.discard_reason for r in cancelled)
    out["cancelled/count"] = float(len(cancelled) + extra_cancelled)
    for reason in CANCEL_REASONS:
        out[f"cancelled/{reason}/count"] = float(cancel_counts.get(reason, 0))
    return out


def perf_metrics(step_time_s: float, tokens: int, async_level: int | None = None) -> dict[str, float]:
    """Throughput keys the console shows: ``perf/step_time_s``, ``perf/tokens_per_s``, ``perf/async_level``.

    Args:
        step_time_s: wall time of the step (previous step end to this step end).
        tokens: prompt + completion tokens trained on in the step.
        async_level: inference_step - trainer_step when the step was taken.
    """
    out = {"perf/step_time_s": float(step_time_s), "perf/tokens": float(tokens)}
    out["perf/tokens_per_s"] = tokens / step_time_s if step_time_s > 0 else 0.0
    if async_level is not None:
        out["perf/async_level"] = float(async_level)
    return out
