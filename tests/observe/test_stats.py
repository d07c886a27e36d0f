"""Gini, max/median and key splitting against hand-computed values and a brute-force Gini."""

from __future__ import annotations

import random

import pytest

from telescope.core.observe import gini, max_median_ratio, split_metric_key, summary


def brute_gini(xs: list[float]) -> float:
    n, mean = len(xs), sum(xs) / len(xs)
    return sum(abs(a - b) for a in xs for b in xs) / (2 * n * n * mean)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0, 0, 1, 1], 0.5),  # 8 unequal ordered pairs / (2*16*0.5)
        ([1, 2, 3], 8 / 36),
        ([0, 0, 0, 4], 0.75),
        ([3, 3, 3], 0.0),
        ([0, 0, 0], 0.0),
        ([5], 0.0),
        ([-1, 1], 0.5),  # shifted by the minimum to [0, 2]
    ],
)
def test_gini_hand_values(values: list[float], expected: float) -> None:
    assert gini(values) == pytest.approx(expected)


def test_gini_matches_pairwise_definition() -> None:
    rng = random.Random(0)
    for _ in range(50):
        xs = [rng.uniform(0, 10) for _ in range(rng.randint(2, 12))]
        assert gini(xs) == pytest.approx(brute_gini(xs))


def test_max_median_ratio() -> None:
    assert max_median_ratio([10, 20, 30, 40]) == pytest.approx(40 / 25)
    assert max_median_ratio([4, 4, 4, 8]) == pytest.approx(2.0)
    assert max_median_ratio([0, 0, 5]) is None


def test_summary_population_std() -> None:
    s = summary([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0])
    assert s == pytest.approx({"mean": 0.5, "std": 0.5**0.5, "min": 0.0, "max": 2.0})
    assert summary([]) == {}


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        ("entropy", ("General", "", "entropy")),
        ("loss/policy", ("loss", "", "policy")),
        ("timing/forward/total", ("timing", "forward", "total")),
        ("debug/grads/layer/norm", ("debug", "grads/layer", "norm")),
    ],
)
def test_split_metric_key(key: str, parts: tuple[str, str, str]) -> None:
    assert split_metric_key(key) == parts


@pytest.mark.parametrize("bad", ["", "/x", "x/", "a//b"])
def test_split_metric_key_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        split_metric_key(bad)
