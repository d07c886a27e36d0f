"""Deterministic environments for the eval tests: scores depend only on the completion text."""

from __future__ import annotations

from typing import Any, ClassVar

from telescope.core import hookimpl
from telescope.core.env import (
    EvalMetricsResult,
    RewardResult,
    Sample,
    SingleTurnEnvironment,
    SingleTurnKwargs,
)


def parity(text: str) -> float:
    """1.0 when the completion has an even number of characters (about half of random outputs)."""
    return 1.0 if len(text) % 2 == 0 else 0.0


class ParityEnv(SingleTurnEnvironment):
    """Prompts 'count to i'; reward = parity of the completion's length; metric 'length'."""

    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs
    default_name = "parity"

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        samples = [Sample(f"count to {i}", str(i), {"i": i}) for i in range(12)]
        return samples if num_samples < 0 else samples[:num_samples]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(
            parity(completion), {"parity": parity(completion), "length": float(len(completion))}
        )


class OwnMetricsEnv(ParityEnv):
    """Reports its own eval metrics (compute_eval_metrics differs from the reward's)."""

    default_name = "own_metrics"

    async def compute_eval_metrics(
        self, completion: str, sample: Sample, eos_token: str = ""
    ) -> EvalMetricsResult:
        return EvalMetricsResult(metrics={"odd": 1.0 - parity(completion)})


def _factory(cls: type) -> Any:
    return lambda kwargs: cls(kwargs)


@hookimpl
def telescope_register_environments(register: Any) -> None:
    register.add("parity", _factory(ParityEnv), kwargs_model=SingleTurnKwargs, description="eval tests")
    register.add(
        "own_metrics", _factory(OwnMetricsEnv), kwargs_model=SingleTurnKwargs, description="eval tests"
    )
