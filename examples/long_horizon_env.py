"""A multi-turn environment whose episodes outgrow the context window: ``long_horizon_reverse``.

Each episode is 24 turns; every turn the environment shows one word and the policy answers it
reversed. An episode needs ~50 tokens a turn, ~1,200 in all, more than the example's
``max_model_len`` (512): without compaction it stops at the context limit; with
``context_compaction_at_tokens`` the policy summarizes and the episode goes on
(examples/long_horizon.yaml). The reward is the mean, over the episode's words, of the fraction of
letters the answer has right in place (partial credit: the tiny model rarely reverses a word whole).

The compactor shows the environment hook: a short summary request (the tiny model's window is
small) and a summary kept even when it ran out of tokens (the tiny model rarely ends one).
"""

from __future__ import annotations

import random
from typing import ClassVar

from pydantic import Field

from telescope.core import hookimpl
from telescope.core.env import MultiTurnEnvironment, MultiTurnKwargs, RewardResult, Sample
from telescope.core.env.compaction import Compactor
from telescope.core.env.types import ChatMessage, RolloutState

LETTERS = "abcdefghij"


class LongHorizonKwargs(MultiTurnKwargs):
    """Kwargs of ``long_horizon_reverse``."""

    max_turns: int = Field(default=24, ge=1)
    """Words per episode (one turn each)."""
    num_episodes: int = Field(default=64, ge=1)
    """Episodes in the dataset."""


class ShortCompactor(Compactor):
    """A one-line summary request; a summary cut at max_tokens is kept (an empty one is retried)."""

    summary_request = "Summarize your progress in a few words."
    summary_heading = "Summary:"

    def summary(self, text: str, truncated: bool, state: RolloutState) -> str | None:
        return text.strip() or None


class LongHorizonReverse(MultiTurnEnvironment):
    """Reverse one word per turn for ``max_turns`` turns."""

    kwargs_model: ClassVar[type[MultiTurnKwargs]] = LongHorizonKwargs
    default_name = "long_horizon_reverse"

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        rng = random.Random(0)
        turns, count = self.kwargs.max_turns, getattr(self.kwargs, "num_episodes", 64)
        samples = []
        for i in range(count):
            words = ["".join(rng.choice(LETTERS) for _ in range(5)) for _ in range(turns)]
            prompt = f"Reverse each word I send. Word 1 of {turns}: {words[0]}"
            samples.append(Sample(prompt, " ".join(w[::-1] for w in words), {"words": words, "id": i}))
        self._samples = samples if num_samples < 0 else samples[:num_samples]
        return self._samples

    def compactor(self) -> Compactor:
        return ShortCompactor()

    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        words: list[str] = state.sample.metadata["words"]
        turn = state.num_turns  # answers given so far
        answer, target = str(messages[-1].get("content", "")).strip(), words[turn - 1][::-1]
        state.custom["letters"] = state.custom.get("letters", 0.0) + sum(
            a == b for a, b in zip(answer, target, strict=False)
        ) / len(target)
        if turn >= len(words):
            return []
        return [{"role": "user", "content": f"Word {turn + 1} of {len(words)}: {words[turn]}"}]

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        words = len(state.sample.metadata["words"])
        letters = float(state.custom.get("letters", 0.0))
        return RewardResult(letters / words, {"letters": letters, "turns": float(state.num_turns)})


@hookimpl
def telescope_register_environments(register):  # type: ignore[no-untyped-def]
    register.add(
        "long_horizon_reverse",
        "long_horizon_env:LongHorizonReverse",
        kwargs_model=LongHorizonKwargs,
        description="reverse a word per turn for 24 turns: episodes longer than the context window",
    )
