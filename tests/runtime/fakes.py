"""In-process fakes for orchestrator tests: a scripted inference client and a recording trainer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from telescope.core.inference.client import Completion


class ToyEnv(SingleTurnEnvironment):
    """Prompts 'q0'..'qN'; the reward is whatever ``reward_fn(completion, sample)`` says."""

    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs
    default_name = "toy"

    def __init__(self, reward_fn: Callable[[str, Sample], Any], n: int = 20, timeout_s: float = 60.0) -> None:
        super().__init__(SingleTurnKwargs(reward_timeout_s=timeout_s))
        self.reward_fn = reward_fn
        self.n = n

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        self._samples = [Sample(f"q{i}", str(i), {"i": i}) for i in range(self.n)]
        return self._samples

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        value = self.reward_fn(completion, sample)
        if asyncio.iscoroutine(value):
            value = await value
        return RewardResult(total_reward=float(value), sample_metrics={"len": float(len(completion))})


@dataclass
class FakeClient:
    """Answers completions with ``reply(prompt_ids, request_id) -> token ids`` after ``delay(request_id)``."""

    reply: Callable[[list[int], str], list[int]]
    delay: Callable[[str], float] = lambda rid: 0.0
    aborted: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def complete(self, prompt: list[int], **params: Any) -> list[Completion]:
        self.requests.append({"prompt": list(prompt), **params})
        await asyncio.sleep(self.delay(params["request_id"]))
        ids = self.reply(list(prompt), params["request_id"])
        return [Completion(0, ids, [-0.5] * len(ids), "stop", "", list(prompt), None)]

    async def abort(self, request_ids: list[str] | None = None) -> int:
        self.aborted.extend(request_ids or [])
        return len(request_ids or [])


@dataclass
class FakeTrainer:
    """Records every batch and which model versions produced it."""

    dp_world_size: int = 1
    batches: list[Any] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    holds: list[set[int]] = field(default_factory=list)

    async def train_step(self, step: int, batch: Any) -> dict[str, float]:
        self.batches.append(batch)
        await asyncio.sleep(0.01)
        return {"loss": 0.0}

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        self.versions.append(version)
        self.holds.append(set(hold))
        return {"timing_weight_sync_total": 0.0}
