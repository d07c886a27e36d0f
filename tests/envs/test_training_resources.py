"""Training environments get ``prepare_resources`` before the first dispatch and ``close`` at the
end (``build_orchestrator`` / ``RunSession.train`` call these two)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import ClassVar

import pytest

from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from telescope.core.runtime.assemble import close_environments, prepare_environments


class _Tracked(SingleTurnEnvironment):
    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs

    def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
        super().__init__(name=name)
        self.log, self.fail = log, fail

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q")]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(0.0)

    async def prepare_resources(self) -> None:
        self.log.append(f"prepare {self.name}")
        if self.fail:
            raise ConnectionError("sandbox API unreachable")

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_prepare_then_close_every_environment() -> None:
    log: list[str] = []
    envs = {n: _Tracked(log, n) for n in ("a", "b")}
    asyncio.run(prepare_environments(envs))
    asyncio.run(close_environments(SimpleNamespace(prompts=SimpleNamespace(envs=envs))))
    assert log == ["prepare a", "prepare b", "close a", "close b"]


def test_a_failed_prepare_names_the_environment_and_releases_the_others() -> None:
    log: list[str] = []
    envs = {"a": _Tracked(log, "a"), "code": _Tracked(log, "code", fail=True), "c": _Tracked(log, "c")}
    with pytest.raises(
        RuntimeError,
        match=r"environment 'code': prepare_resources failed: ConnectionError: "
        r"sandbox API unreachable \(check it without training: telescope env check code\)",
    ):
        asyncio.run(prepare_environments(envs))
    assert log == ["prepare a", "prepare code", "close a", "close code"]
