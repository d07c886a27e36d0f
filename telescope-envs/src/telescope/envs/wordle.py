"""Wordle: multi-turn word guessing with shipped word lists (no textarena download).

Secrets come from ``wordle_words.txt`` (471 common words); a guess is valid when it is in
``wordle_guesses.txt`` (4667 five-letter words from SCOWL, Debian's ``wamerican``) or a secret.

Reward (max 2.2) = correct (1) + partial credit from the last feedback (0.2 per G, 0.1
per Y, only when not solved) + correct / number of guesses + 0.2 x mean format score.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, ClassVar

from telescope.core.env import (
    MultiTurnEnvironment,
    RewardResult,
    RolloutState,
    Rubric,
    Sample,
)
from telescope.core.env.parsers import extract_xml_tag, strip_think_tags
from telescope.core.env.types import ChatMessage
from telescope.envs.kwargs import WordleKwargs
from telescope.envs.wordle_game import WordleGame

__all__ = ["WordleEnvironment", "WordleKwargs", "format_score"]

SYSTEM_PROMPT = (
    "You are a competitive game player. Think step by step, then give your guess inside "
    "<guess>...</guess> tags as a five-letter word in square brackets, e.g. <guess>[crane]</guess>."
)
INTRO = (
    "You are playing Wordle. Guess the secret five-letter word in at most 6 guesses. After "
    "each guess you get feedback per letter: G = right letter, right place; Y = in the word, "
    "wrong place; X = not in the word. Submit each guess as <guess>[word]</guess>."
)
_GUESS_LINE = re.compile(r"<guess>(.*?)</guess>", re.DOTALL)


def format_score(content: str) -> float:
    """0.4 non-empty guess + 0.2 spacing + 0.2 starts with <guess> + 0.2 ends with </guess>.

    Scored on the message after any thinking. "Spacing" holds unless a guess field has
    whitespace around its content (``<guess> [crane] </guess>``).
    """
    text = strip_think_tags(content).strip()
    raw = _GUESS_LINE.findall(text)
    score = 0.4 if raw and raw[-1].strip() else 0.0
    score += 0.2 if all(r == r.strip() for r in raw) else 0.0
    score += 0.2 if text.startswith("<guess>") else 0.0
    score += 0.2 if text.endswith("</guess>") else 0.0
    return score


def _assistant(messages: list[ChatMessage]) -> list[str]:
    return [str(m.get("content", "")) for m in messages if m.get("role") == "assistant"]


def _last_guess(messages: list[ChatMessage]) -> str | None:
    for content in reversed(_assistant(messages)):
        guess = extract_xml_tag(strip_think_tags(content), "guess")
        if guess is not None:
            return guess.lower()
    return None


def reward_correct(messages: list[ChatMessage], answer: str) -> tuple[float, str]:
    return (1.0 if _last_guess(messages) == f"[{answer}]" else 0.0), answer


def reward_partial(messages: list[ChatMessage], answer: str) -> float:
    if reward_correct(messages, answer)[0]:
        return 0.0
    for m in reversed(messages):
        lines = str(m.get("content", "")).strip().split("\n")
        if m.get("role") == "user" and len(lines) == 3:
            marks = lines[1].split()
            return 0.2 * marks.count("G") + 0.1 * marks.count("Y")
    return 0.0


def reward_length(messages: list[ChatMessage], answer: str) -> float:
    guesses = sum(1 for c in _assistant(messages) if _GUESS_LINE.search(c))
    return reward_correct(messages, answer)[0] / max(guesses, 1)


def reward_format(messages: list[ChatMessage]) -> float:
    contents = _assistant(messages)
    return sum(format_score(c) for c in contents) / len(contents) if contents else 0.0


def _read_words(configured: str | None, shipped: str) -> list[str]:
    """The five-letter words of ``configured`` (a path), else of the shipped file ``shipped``."""
    if configured:
        path = Path(configured)
    else:
        from telescope.envs.sample_data import sample_path

        path = sample_path(shipped)
    words = sorted({w.strip().lower() for w in path.read_text(encoding="utf-8").split() if w.strip()})
    bad = [w for w in words if len(w) != 5 or not w.isalpha()]
    if bad or not words:
        raise ValueError(f"wordle word list {str(path)!r}: need five-letter words, bad entries {bad[:5]}")
    return words


class WordleEnvironment(MultiTurnEnvironment):
    """Wordle against a secret word from the word list."""

    kwargs_model: ClassVar[type[WordleKwargs]] = WordleKwargs  # type: ignore[assignment]
    default_name = "wordle"
    default_system_prompt = SYSTEM_PROMPT
    reward_min = 0.0
    reward_max = 2.2

    def __init__(self, kwargs: WordleKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self.rubric = (
            Rubric()
            .add_reward(reward_correct, name="correct", range_min=0.0, range_max=1.0)
            .add_reward(reward_partial, name="partial", range_min=0.0, range_max=1.0)
            .add_reward(reward_length, name="length", range_min=0.0, range_max=1.0)
            .add_reward(reward_format, 0.2, name="format", range_min=0.0, range_max=1.0)
        )
        kw: WordleKwargs = self.kwargs  # type: ignore[assignment]
        self.words = _read_words(kw.word_list_file, "wordle_words.txt")
        self.guesses = frozenset(_read_words(kw.guess_list_file, "wordle_guesses.txt")) | frozenset(
            self.words
        )

    @property
    def metrics_ranges(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return self.rubric.metrics_ranges

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """``num_samples`` games with secrets drawn by a private seeded RNG."""
        kw: WordleKwargs = self.kwargs  # type: ignore[assignment]
        rng = random.Random(kw.seed)
        count = kw.num_samples if num_samples < 0 else num_samples
        self._samples = [Sample(INTRO, rng.choice(self.words), {}) for _ in range(count)]
        return self._samples

    def reference_completion(self, sample: Sample) -> str | None:
        return f"<guess>[{sample.answer}]</guess>"

    def create_initial_state(self, sample: Sample) -> RolloutState:
        state = super().create_initial_state(sample)
        state.custom["game"] = WordleGame(secret=sample.answer, dictionary=self.guesses)
        return state

    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        """Step the game with the last assistant guess; ``[]`` once the game is over."""
        game: WordleGame = state.custom["game"]
        content = strip_think_tags(str(messages[-1].get("content", ""))) if messages else ""
        observation = game.step(extract_xml_tag(content, "guess") or "")
        if game.done:
            state.custom["game_over"] = True
            return []
        text = observation.split("Feedback:\n", 1)[-1]
        return [{"role": "user", "content": text, "turn_type": "feedback"}]

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        if state.custom.get("game_over"):
            return True, "game_over"
        return super().is_done(state)

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        """The four components over the whole conversation."""
        game: WordleGame = state.custom["game"]
        return await self.rubric.score(
            state=state,
            extra_sample_metrics={"won": float(game.won), "num_guesses": float(len(game.history))},
        )
