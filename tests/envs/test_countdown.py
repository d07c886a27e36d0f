"""Countdown: exact rewards for correct, wrong, malformed and hostile completions."""

from __future__ import annotations

import asyncio
import itertools
import operator
import random

import pytest

from telescope.core.env import Sample
from telescope.envs.countdown import generate_problem
from telescope.envs.safe_arith import UnsafeExpression, safe_arithmetic

NUMS, TARGET = [3, 5, 7], 22  # 3 * 5 + 7


def _score(registry, completion: str) -> tuple[float, float, float]:
    env = registry.create("environment", "countdown", {})
    sample = Sample("q", str(TARGET), {"nums": NUMS, "target": TARGET})
    result = asyncio.run(env.score(completion, sample))
    assert result.sample_metrics["reward_error"] == 0.0
    return result.total_reward, result.sample_metrics["format"], result.sample_metrics["equation"]


@pytest.mark.parametrize(
    ("completion", "total", "fmt", "eq"),
    [
        ("<think>3*5=15, +7</think><answer>3 * 5 + 7</answer>", 2.0, 1.0, 1.0),
        ("3*5=15</think>\n<answer>(3 * 5) + 7</answer>", 2.0, 1.0, 1.0),  # missing <think> is prepended
        ("<think>x</think><answer>7 + 5 * 3</answer><|endoftext|>", 2.0, 1.0, 1.0),  # trailing EOS stripped
        ("<think>x</think><answer>3 + 5 + 7</answer>", 1.0, 1.0, 0.0),  # wrong value
        ("<think>x</think><answer>3 * 5 + 7 = 22</answer>", 0.5, 0.5, 0.0),  # '=' is not arithmetic
        ("<think>x</think><answer>3 * 5 + 7 + 7</answer>", 1.0, 1.0, 0.0),  # reused number
        ("<think>x</think><answer>3 * 5 + 8 - 1</answer>", 1.0, 1.0, 0.0),  # numbers not given
        ("<think>x</think><answer>5 * 3</answer>", 1.0, 1.0, 0.0),  # a number unused
        ("<answer>3 * 5 + 7</answer>", 1.0, 0.0, 1.0),  # no </think>: bad format, right equation
        ("<think>x</think><answer>3*5+7</answer> trailing text", 1.0, 0.0, 1.0),
        ("<think>a<think>b</think><answer>3*5+7</answer>", 1.0, 0.0, 1.0),  # nested think
        ("<think>x</think><answer>__import__('os').system('echo pwned')</answer>", 0.5, 0.5, 0.0),
        ("<think>x</think><answer>9**9**9</answer>", 1.0, 1.0, 0.0),  # arithmetic chars, but never run
        ("<think>x</think><answer>(3 / (5 - 5)) + 7</answer>", 1.0, 1.0, 0.0),  # division by zero
        ("", 0.0, 0.0, 0.0),
    ],
)
def test_countdown_rewards(registry, completion: str, total: float, fmt: float, eq: float) -> None:
    assert _score(registry, completion) == (total, fmt, eq)


def test_countdown_hostile_sizes(registry) -> None:
    big = "<think>" + "a" * 10_000 + "</think><answer>" + "1+" * 5_000 + "1</answer>"
    assert _score(registry, big) == (1.0, 1.0, 0.0)  # over 200 chars: equation rejected
    assert _score(registry, "x" * 10_240) == (0.0, 0.0, 0.0)
    deep = "<think>x</think><answer>" + "(" * 90 + "3*5+7" + ")" * 90 + "</answer>"
    assert _score(registry, deep) == (2.0, 1.0, 1.0)  # 185 chars: within bounds, evaluated safely
    too_deep = "<think>x</think><answer>" + "(" * 100 + "3*5+7" + ")" * 100 + "</answer>"
    assert _score(registry, too_deep) == (1.0, 1.0, 0.0)  # 205 chars: rejected unparsed


def test_countdown_power_tower_is_not_evaluated(registry) -> None:
    env = registry.create("environment", "countdown", {})
    sample = Sample("q", "729", {"nums": [9, 9, 9], "target": 729})
    result = asyncio.run(env.score("<think>x</think><answer>9**9**9</answer>", sample))
    assert (result.total_reward, result.sample_metrics["equation"]) == (1.0, 0.0)
    assert asyncio.run(env.score("<think>x</think><answer>9*9*9</answer>", sample)).total_reward == 2.0


def test_safe_arithmetic_rejects_everything_but_arithmetic() -> None:
    assert safe_arithmetic("-(3 - 5) * 2 / 4") == 1.0
    for bad in (
        "__import__('os')",
        "9**9",
        "a + 1",
        "[1][0]",
        "(lambda: 1)()",
        "1 if 1 else 2",
        "1e400 * 1e400",
    ):
        with pytest.raises(UnsafeExpression):
            safe_arithmetic(bad)
    with pytest.raises(UnsafeExpression):
        safe_arithmetic("99999999*99999999*99999999")  # bounded magnitude
    with pytest.raises(ZeroDivisionError):
        safe_arithmetic("1/0")


def _solvable(nums: list[int], target: int) -> bool:
    """Brute force over orders and operators (left-to-right chains, as the generator builds)."""
    ops = [operator.add, operator.sub, operator.mul, lambda a, b: a / b if b else float("nan")]
    for perm in itertools.permutations(nums):
        for chosen in itertools.product(ops, repeat=len(nums) - 1):
            value = perm[0]
            for op, n in zip(chosen, perm[1:], strict=True):
                value = op(value, n)
            if abs(value - target) < 1e-9:
                return True
    return False


def test_generated_problems_are_seeded_and_solvable(registry) -> None:
    env = registry.create("environment", "countdown", {"num_generated": 30, "seed": 3})
    samples = env.load_dataset()
    again = registry.create("environment", "countdown", {"num_generated": 30, "seed": 3}).load_dataset()
    assert [s.metadata for s in samples] == [s.metadata for s in again]
    assert all(
        3 <= len(s.metadata["nums"]) <= 4 and _solvable(s.metadata["nums"], s.metadata["target"])
        for s in samples
    )
    rng = random.Random(0)
    state = random.getstate()
    generate_problem(rng, 4, 99)
    assert random.getstate() == state  # the global RNG is never touched


def test_shipped_sample_file_is_solvable(registry) -> None:
    samples = registry.create("environment", "countdown", {"sample_data": True}).load_dataset()
    assert len(samples) == 40
    assert all(_solvable(s.metadata["nums"], s.metadata["target"]) for s in samples)
