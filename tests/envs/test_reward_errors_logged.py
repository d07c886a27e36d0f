"""Reward failures are loud: the first failure of each reward function per environment is logged
with its traceback (later ones are only counted in the sample metrics)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import pytest

from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from telescope.core.env.rubric import Rubric


def exact(completion: str, answer: str) -> float:
    return float(completion == answer)


def parse_number(completion: str) -> float:
    return float(int(completion))  # raises ValueError on text


class RubricEnv(SingleTurnEnvironment):
    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.rubric = Rubric().add_reward(exact).add_reward(parse_number)

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q", "7", {})]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return await self.rubric.score(completion=completion, sample=sample)


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "telescope.env" and "failed" in r.getMessage()]


def test_first_failure_of_each_function_is_logged_once_per_environment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = RubricEnv("first"), RubricEnv("second")
    sample = first.samples()[0]

    async def score_all() -> list[Any]:
        return [await env.score(text, sample) for env in (first, second) for text in ("7", "x", "y", "z")]

    with caplog.at_level(logging.WARNING, logger="telescope.env"):
        results = asyncio.run(score_all())
    assert [r.sample_metrics["reward_error"] for r in results] == [
        0.0,
        1.0,
        1.0,
        1.0,
    ] * 2  # every one counted
    logged = failures(caplog)
    assert [r.getMessage().split(":")[0] for r in logged] == ["environment 'first'", "environment 'second'"]
    for record in logged:
        assert "reward function 'parse_number' failed: ValueError: invalid literal" in record.getMessage()
        assert (
            record.exc_info is not None and record.exc_info[0] is ValueError
        )  # the traceback goes to the log


def test_a_raising_compute_reward_is_logged_once_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(RubricEnv):
        async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
            raise KeyError("answer")

    env = Broken("broken")
    with caplog.at_level(logging.WARNING, logger="telescope.env"):
        results = [asyncio.run(env.score("7", env.samples()[0])) for _ in range(3)]
    assert all(r.total_reward == 0.0 and r.sample_metrics["reward_error"] == 1.0 for r in results)
    (record,) = failures(caplog)
    assert (
        "environment 'broken': reward function 'compute_reward' failed: KeyError: 'answer'"
        in record.getMessage()
    )
    assert record.exc_info is not None
