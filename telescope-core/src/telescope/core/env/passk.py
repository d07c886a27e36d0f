"""pass@k and pass^k with the unbiased estimators over all n samples drawn per prompt.

With n samples of which c are correct:
- pass@k = 1 - C(n-c, k) / C(n, k)  (probability that at least one of k draws is correct)
- pass^k = C(c, k) / C(n, k)        (probability that all k draws are correct)
Both use every drawn sample, not just the first k (an anchor bug we avoid).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import comb

__all__ = ["aggregate_pass_k", "pass_at_k", "pass_pow_k", "sample_pass_k"]


def _check(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= correct <= n, got correct={c}, n={n}")
    if n < k:
        raise ValueError(
            f"pass@{k} needs at least k samples per prompt, got n={n}: draw >= {k} completions per prompt"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct."""
    _check(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_pow_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (all k correct) from ``n`` samples with ``c`` correct."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


_ESTIMATORS = {"at": pass_at_k, "pow": pass_pow_k}


def sample_pass_k(
    values: Sequence[float], k: int, *, kind: str = "at", threshold: float = 0.0
) -> float | None:
    """pass@k (``kind="at"``) or pass^k (``kind="pow"``) of one prompt from all its completions' values.

    A completion passes when its value is ``> threshold``; None when fewer than k values exist.
    """
    fn = _ESTIMATORS.get(kind)
    if fn is None:
        raise ValueError(f"kind must be 'at' or 'pow', got {kind!r}")
    if len(values) < k:
        return None
    return fn(len(values), sum(x > threshold for x in values), k)


def aggregate_pass_k(
    values_per_prompt: Iterable[Sequence[float]],
    ks: Iterable[int],
    *,
    kind: str = "at",
    threshold: float = 0.0,
) -> dict[int, float]:
    """Mean pass@k (``kind="at"``) or pass^k (``kind="pow"``) over prompts.

    A completion counts as correct when its metric value is ``> threshold``. Prompts with
    fewer than k valid completions are skipped for that k (they cannot give an unbiased
    estimate); a k no prompt supports is left out of the result.
    """
    if kind not in _ESTIMATORS:
        raise ValueError(f"kind must be 'at' or 'pow', got {kind!r}")
    prompts = [list(v) for v in values_per_prompt]
    out: dict[int, float] = {}
    for k in ks:
        per_prompt = [sample_pass_k(v, k, kind=kind, threshold=threshold) for v in prompts]
        scores = [s for s in per_prompt if s is not None]
        if scores:
            out[k] = sum(scores) / len(scores)
    return out
