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


class FlakySandboxEnv(OwnMetricsEnv):
    """Its eval metrics need a sandbox that fails to start for sample 0 once and for sample 1 always
    (an infrastructure failure, raised where it happens as a sandbox provider raises it)."""

    default_name = "flaky_sandbox"
    calls: ClassVar[dict[int, int]] = {}
    """Eval-metric calls per sample index (reset by the test)."""

    async def compute_eval_metrics(
        self, completion: str, sample: Sample, eos_token: str = ""
    ) -> EvalMetricsResult:
        from telescope.core.infra import failure

        i = int(sample.metadata["i"])
        self.calls[i] = self.calls.get(i, 0) + 1
        if i == 1 or (i == 0 and self.calls[i] == 1):
            raise failure(f"sandbox for sample {i} did not start", cause="sandbox_create", provider="fake")
        return await super().compute_eval_metrics(completion, sample, eos_token)


def _factory(cls: type) -> Any:
    return lambda kwargs: cls(kwargs)


@hookimpl
def telescope_register_environments(register: Any) -> None:
    register.add("parity", _factory(ParityEnv), kwargs_model=SingleTurnKwargs, description="eval tests")
    register.add(
        "own_metrics", _factory(OwnMetricsEnv), kwargs_model=SingleTurnKwargs, description="eval tests"
    )
    register.add(
        "flaky_sandbox", _factory(FlakySandboxEnv), kwargs_model=SingleTurnKwargs, description="eval tests"
    )
