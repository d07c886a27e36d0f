"""The shout_reverse environment: reply with the word reversed and upper-cased."""

from __future__ import annotations

import random
from typing import ClassVar

from telescope.core.env import RewardResult, Rubric, Sample, SingleTurnEnvironment, strip_think_tags
from telescope_example_env.plugin import ShoutReverseKwargs

WORDS = ["river", "stone", "cloud", "maple", "piano", "tiger", "lemon", "ocean"]


def exact(completion: str, answer: str) -> float:
    """1.0 when the reply (after any thinking) is exactly the answer."""
    return 1.0 if strip_think_tags(completion).strip() == answer else 0.0


class ShoutReverseEnvironment(SingleTurnEnvironment):
    """Reverse and upper-case one word."""

    kwargs_model: ClassVar[type[ShoutReverseKwargs]] = ShoutReverseKwargs  # type: ignore[assignment]
    default_name = "shout_reverse"
    default_instruction_prompt = "Write this word backwards in capital letters:"
    reward_min, reward_max = 0.0, 1.0

    def __init__(self, kwargs: ShoutReverseKwargs | None = None, **extra: object) -> None:
        super().__init__(kwargs, **extra)  # type: ignore[arg-type]
        self.rubric = Rubric().add_reward(exact, name="exact", range_min=0.0, range_max=1.0)

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        kw: ShoutReverseKwargs = self.kwargs  # type: ignore[assignment]
        rng = random.Random(kw.seed)
        count = kw.num_samples if num_samples < 0 else num_samples
        words = [rng.choice(WORDS) for _ in range(count)]
        self._samples = [Sample(w, w[::-1].upper()) for w in words]
        return self._samples

    def reference_completion(self, sample: Sample) -> str | None:
        return sample.answer

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return await self.rubric.score(completion=completion, sample=sample)
