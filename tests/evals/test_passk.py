"""pass@k / pass^k: the unbiased estimators against their closed forms, and pass_k parsing."""

from __future__ import annotations

from math import comb, prod

import pytest
from pydantic import ValidationError

from telescope.core.config.entries import EvalEntry, PassKConfig
from telescope.core.env.passk import pass_at_k, pass_pow_k, sample_pass_k
from telescope.core.evals import CompletionOutcome, aggregate, flat_metrics


def closed_at(n: int, c: int, k: int) -> float:
    # Chen et al.: 1 - prod_{i<k} (n-c-i)/(n-i), which is 1 when fewer than k failures exist.
    return 1.0 if n - c < k else 1.0 - prod((n - c - i) / (n - i) for i in range(k))


def closed_pow(n: int, c: int, k: int) -> float:
    return 0.0 if c < k else prod((c - i) / (n - i) for i in range(k))


@pytest.mark.parametrize(
    ("n", "c", "k"), [(8, 3, 2), (10, 1, 4), (5, 5, 3), (6, 0, 2), (4, 2, 4), (7, 6, 1), (9, 4, 9)]
)
def test_estimators_match_the_closed_forms(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(closed_at(n, c, k))
    assert pass_pow_k(n, c, k) == pytest.approx(closed_pow(n, c, k))


def test_hand_computed_values() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_pow_k(4, 3, 2) == pytest.approx(0.5)  # C(3,2)/C(4,2) = 3/6
    assert pass_at_k(6, 0, 3) == 0.0 and pass_pow_k(6, 0, 3) == 0.0  # c = 0
    assert pass_at_k(6, 6, 3) == 1.0 and pass_pow_k(6, 6, 3) == 1.0  # c = n
    # n > k uses every completion: 1 correct of 8 gives pass@2 = 1/4, not "first 2 correct?".
    assert sample_pass_k([0, 0, 0, 0, 0, 0, 0, 1], 2) == pytest.approx(1 - comb(7, 2) / comb(8, 2))
    assert sample_pass_k([1, 1], 3) is None  # fewer than k completions: no unbiased estimate


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(3, 1, 0)
    with pytest.raises(ValueError, match="0 <= correct <= n"):
        pass_pow_k(3, 4, 1)
    with pytest.raises(ValueError, match="'at' or 'pow'"):
        sample_pass_k([1.0], 1, kind="any")


@pytest.mark.parametrize(
    ("raw", "at", "pow_", "max_k"),
    [
        ({}, ([], None), ([], None), 1),
        ([4, 1, 4], ([1, 4], None), ([], None), 4),
        ({"at_k": [1, 8], "pow_k": [2]}, ([1, 8], None), ([2], None), 8),
        (
            {"at_k": {"metrics": ["correct"], "k": [2]}, "pow_k": {"k": [3]}},
            ([2], ["correct"]),
            ([3], None),
            3,
        ),
    ],
)
def test_pass_k_forms(raw: object, at: tuple, pow_: tuple, max_k: int) -> None:
    cfg = EvalEntry(name="math500", pass_k=raw).pass_k  # type: ignore[arg-type]
    assert (cfg.at_k.k, cfg.at_k.metrics) == at
    assert (cfg.pow_k.k, cfg.pow_k.metrics) == pow_
    assert cfg.max_k == max_k
    assert EvalEntry.model_validate(EvalEntry(name="x", pass_k=raw).model_dump()).pass_k == cfg  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (4, "pass_k must be a mapping"),
        ("1,4", "pass_k must be a mapping"),
        ({"at_k": {"k": [0, 2]}}, "k values must be integers >= 1, got \\[0\\]"),
        ({"at_k": {"metrics": []}}, "metrics must be non-empty"),
        ({"at": [1]}, "at\n  Extra inputs are not permitted"),
        ({"at_k": {"k": [1], "metric": ["x"]}}, "metric\n  Extra inputs"),
    ],
)
def test_bad_pass_k_is_a_clear_error(raw: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EvalEntry(name="math500", pass_k=raw)  # type: ignore[arg-type]


def _outcomes(values: list[list[float | None]]) -> list[list[CompletionOutcome]]:
    return [
        [
            CompletionOutcome(text="x", reward=v, metrics={"correct": v, "len": 2.0})
            if v is not None
            else CompletionOutcome(error="InferenceServerError: boom")
            for v in per
        ]
        for per in values
    ]


def test_aggregate_over_all_completions_with_errors_counted() -> None:
    values: list[list[float | None]] = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, None, 1]]
    pass_k = PassKConfig.model_validate(
        {"at_k": {"metrics": ["correct"], "k": [1, 2, 4]}, "pow_k": {"k": [2]}}
    )
    samples = [(i, f"p{i}", str(i)) for i in range(3)]
    result = aggregate("m", 5, pass_k, samples, _outcomes(values))
    m = result.metrics
    assert m["num_samples"] == 3 and m["num_completions"] == 11 and m["errors"] == 1
    assert m["correct"] == pytest.approx(5 / 11) and m["len"] == 2.0
    assert m["pass@1/correct"] == pytest.approx((2 / 4 + 0 + 1) / 3)
    assert m["pass@2/correct"] == pytest.approx((closed_at(4, 2, 2) + 0 + closed_at(3, 3, 2)) / 3)
    # The sample with an error has only 3 completions: it cannot inform k = 4.
    assert m["pass@4/correct"] == pytest.approx((closed_at(4, 2, 4) + 0) / 2)
    # pow_k without metrics = every metric the eval reports.
    assert m["pass^2/correct"] == pytest.approx((closed_pow(4, 2, 2) + 0 + 1) / 3)
    assert m["pass^2/len"] == 1.0
    assert "pass@1/len" not in m
    assert result.rows[2]["errors"] == [None, None, "InferenceServerError: boom", None]
    assert result.rows[0]["pass@2/correct"] == pytest.approx(closed_at(4, 2, 2))
    assert result.rows[2]["pass@4/correct"] is None
    assert flat_metrics([result])["eval/m/pass@2/correct"] == m["pass@2/correct"]


def test_a_failed_scoring_counts_zero_for_the_metrics_it_lacks() -> None:
    outs = [
        [
            CompletionOutcome("a", 1.0, {"correct": 1.0}),
            CompletionOutcome("b", 0.0, {"reward_error": 1.0, "reward_timeout": 0.0}),
        ]
    ]
    result = aggregate("m", 0, PassKConfig.model_validate([2]), [(0, "p", "a")], outs)
    assert result.metrics["correct"] == 0.5
    assert result.metrics["pass@2/correct"] == 1.0
    assert "pass@2/reward_error" not in result.metrics  # scoring failures are not pass@k targets
