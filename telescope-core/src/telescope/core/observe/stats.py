"""Small, dependency-free statistics used by the step metrics (pure Python, no numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["gini", "max_median_ratio", "median", "summary", "split_metric_key"]


def summary(values: Sequence[float]) -> dict[str, float]:
    """``mean``, ``std`` (population, ddof=0), ``min`` and ``max``; empty input gives ``{}``."""
    if not values:
        return {}
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / n
    return {"mean": mean, "std": math.sqrt(var), "min": float(min(values)), "max": float(max(values))}


def gini(values: Sequence[float]) -> float:
    """Gini coefficient: ``sum_ij |x_i - x_j| / (2 n^2 mean)``; 0 = all equal.

    Defined for non-negative values. A group with a negative value is shifted by its
    minimum first (so the result measures spread above the worst sample). An all-zero group
    (mean 0) has Gini 0. Single values have Gini 0.
    """
    n = len(values)
    if n < 2:
        return 0.0
    low = min(values)
    xs = sorted(v - low for v in values) if low < 0 else sorted(values)
    total = math.fsum(xs)
    if total <= 0:
        return 0.0
    # Sorted form of the pairwise sum: sum_ij |xi-xj| = 2 * sum_i (2i - n + 1) x_(i).
    weighted = math.fsum((2 * i - n + 1) * x for i, x in enumerate(xs))
    return weighted / (n * total)


def median(values: Sequence[float]) -> float:
    """Median (mean of the two middle values for an even count)."""
    if not values:
        raise ValueError("median of an empty sequence: pass at least one value")
    xs = sorted(values)
    mid = len(xs) // 2
    return float(xs[mid]) if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def max_median_ratio(values: Sequence[float]) -> float | None:
    """``max / median``; None when the median is 0 (the ratio is undefined)."""
    med = median(values)
    return None if med == 0 else max(values) / med


def split_metric_key(key: str) -> tuple[str, str, str]:
    """Split a step-metric key into ``(section, group, metric)`` (the seed's convention).

    ``"entropy"`` -> ``("General", "", "entropy")``; ``"loss/policy"`` -> ``("loss", "",
    "policy")``; ``"timing/forward/total"`` -> ``("timing", "forward", "total")``; with more
    than two slashes the middle parts form the group: ``"a/b/c/d"`` -> ``("a", "b/c", "d")``.
    """
    if not key or key.startswith("/") or key.endswith("/") or "//" in key:
        raise ValueError(
            f"metric key {key!r} is malformed: use 'name', 'section/name' or 'section/group/name' "
            "with non-empty parts"
        )
    parts = key.split("/")
    if len(parts) == 1:
        return "General", "", parts[0]
    if len(parts) == 2:
        return parts[0], "", parts[1]
    return parts[0], "/".join(parts[1:-1]), parts[-1]
