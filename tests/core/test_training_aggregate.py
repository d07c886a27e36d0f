"""Step aggregation shared by the FSDP and Megatron backends: loss mean, grad norm, counters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from telescope.core.training.aggregate import count, global_loss_counts, step_metrics


@dataclass
class Row:
    num_loss_tokens: int
    num_samples: int


def test_global_loss_counts_without_process_group_sums_rows() -> None:
    pytest.importorskip("torch")
    assert global_loss_counts([Row(5, 2), Row(7, 3), Row(0, 0)], "cpu") == (12.0, 5.0)


def test_step_metrics_means_and_counter_deltas() -> None:
    counters = {"optimizer_steps": 4, "empty_minibatches": 1}
    before = dict(counters)
    count(counters, "optimizer_steps")
    count(counters, "skipped_nonfinite_steps")
    count(counters, "empty_minibatches")
    out = step_metrics({"loss": 0.9, "entropy": 2.0}, [2.0, float("nan"), 4.0], counters, before, 4)
    assert out["loss"] == pytest.approx(0.9 / 3)  # summed over 3 trained minibatches -> mean
    assert out["grad_norm"] == pytest.approx(3.0)  # the NaN (skipped) norm is left out
    assert out["entropy"] == 2.0
    assert out["train/optimizer_steps"] == 1.0 and out["train/skipped_nonfinite_steps"] == 1.0
    assert out["train/empty_minibatches"] == 1.0 and out["train/minibatches"] == 4.0
    assert counters == {"optimizer_steps": 5, "empty_minibatches": 2, "skipped_nonfinite_steps": 1}


def test_step_metrics_without_trained_minibatch() -> None:
    out = step_metrics({}, [], {}, {}, 1)
    assert math.isnan(out["grad_norm"]) and "loss" not in out and out["train/optimizer_steps"] == 0.0


def test_unknown_counter_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown step counter 'optimizer_step'"):
        count({}, "optimizer_step")
