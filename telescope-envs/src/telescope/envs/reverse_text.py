"""reverse_text: reverse a short string; reward = LCS similarity ratio in [0, 1].

A procedural toy task (no data files) small models learn quickly: the CPU quickstart trains on it.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from telescope.core.env import RewardResult, Rubric, Sample, SingleTurnEnvironment
from telescope.core.env.parsers import strip_think_tags
from telescope.core.models.demo_tasks import REVERSE_SYSTEM_PROMPT, reverse_phrase
from telescope.envs.kwargs import ReverseTextKwargs
from telescope.envs.lcs import lcs_ratio

__all__ = ["ReverseTextEnvironment", "ReverseTextKwargs", "reverse_reward"]


def reverse_reward(completion: str, answer: str) -> float:
    """LCS ratio between the (think-stripped, trimmed) completion and the reversed text."""
    return lcs_ratio(strip_think_tags(completion).strip(), answer)


class ReverseTextEnvironment(SingleTurnEnvironment):
    """Reverse the characters of a short phrase."""

    kwargs_model: ClassVar[type[ReverseTextKwargs]] = ReverseTextKwargs  # type: ignore[assignment]
    default_name = "reverse_text"
    default_system_prompt = REVERSE_SYSTEM_PROMPT
    reward_min = 0.0
    reward_max = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "lcs_ratio": {"min": 0.0, "max": 1.0, "invert": False}
    }

    def __init__(self, kwargs: ReverseTextKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self.rubric = Rubric().add_reward(reverse_reward, name="lcs_ratio", range_min=0.0, range_max=1.0)

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Seeded random phrases and their reversals."""
        kw: ReverseTextKwargs = self.kwargs  # type: ignore[assignment]
        if kw.min_words > kw.max_words:
            raise ValueError(f"reverse_text: min_words ({kw.min_words}) > max_words ({kw.max_words})")
        rng = random.Random(kw.seed)
        limit = num_samples if num_samples >= 0 else kw.num_samples
        count = kw.num_generated if limit < 0 else min(limit, kw.num_generated)
        self._samples = []
        for _ in range(count):
            text = reverse_phrase(rng, kw.min_words, kw.max_words)
            self._samples.append(Sample(text, text[::-1], {"text": text}))
        return self._samples

    def reference_completion(self, sample: Sample) -> str | None:
        return sample.answer

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """LCS similarity of the answer to the reversed text."""
        return await self.rubric.score(completion=completion, sample=sample)
