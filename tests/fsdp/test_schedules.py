"""LR schedules: values at chosen steps, computed by hand from the documented formulas."""

from __future__ import annotations

import math

import pytest

from telescope.core.training.schedules import LRSchedule, lr_factor


def f(step: int, schedule: str, warmup: int = 0, total: int = 11, min_ratio: float = 0.0) -> float:
    return lr_factor(step, schedule=schedule, warmup_steps=warmup, total_steps=total, min_lr_ratio=min_ratio)


def test_none_is_fixed_even_with_warmup() -> None:
    assert [f(s, "none", warmup=5) for s in (0, 3, 10)] == [1.0, 1.0, 1.0]


def test_constant_warmup_then_flat() -> None:
    assert [f(s, "constant", warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(0, "constant") == 1.0


def test_linear_decay_to_min_ratio_at_last_step() -> None:
    # warmup 2 over steps 0,1; decay over steps 2..10 (8 intervals) from 1 to 0.2
    assert f(0, "linear", 2, 11, 0.2) == pytest.approx(0.5)
    assert f(1, "linear", 2, 11, 0.2) == pytest.approx(1.0)
    assert f(2, "linear", 2, 11, 0.2) == pytest.approx(1.0)
    assert f(6, "linear", 2, 11, 0.2) == pytest.approx(1.0 - 0.8 * 4 / 8)
    assert f(10, "linear", 2, 11, 0.2) == pytest.approx(0.2)
    assert f(50, "linear", 2, 11, 0.2) == pytest.approx(0.2)


def test_cosine_values() -> None:
    assert f(0, "cosine", 0, 11, 0.1) == pytest.approx(1.0)
    assert f(5, "cosine", 0, 11, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(5, "cosine", 0, 11, 0.1) == pytest.approx(0.55)
    assert f(10, "cosine", 0, 11, 0.1) == pytest.approx(0.1)


def test_from_config_and_bad_values() -> None:
    from telescope.core.testing import make_config

    sched = LRSchedule.from_config(
        make_config(lr_scheduler="linear", warmup_steps=0, number_of_steps=3, min_lr_ratio=0.0)
    )
    assert [sched(s) for s in range(3)] == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="lr_scheduler must be one of"):
        f(0, "exp")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        f(0, "linear", min_ratio=1.5)
