"""Wordle rules: guess parsing, feedback and the invalid-move allowance (no I/O)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["WordleGame", "score_guess"]

_BRACKETED = re.compile(r"\[(\w+)\]")


def score_guess(guess: str, secret: str) -> str:
    """Feedback letters: G (right place), Y (in the word, wrong place), X (absent).

    Duplicates are counted: exact matches first, then yellows only while the secret still
    has unmatched copies of that letter.
    """
    marks = ["X"] * len(guess)
    remaining: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
        else:
            remaining[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and remaining[g] > 0:
            marks[i] = "Y"
            remaining[g] -= 1
    return "".join(marks)


@dataclass
class WordleGame:
    """One game. ``step`` takes the model's guess text and returns the observation."""

    secret: str
    dictionary: frozenset[str]
    word_length: int = 5
    num_guesses: int = 6
    error_allowance: int = 1
    history: list[str] = field(default_factory=list)
    invalid_streak: int = 0
    done: bool = False
    won: bool = False

    def _invalid(self, reason: str) -> str:
        self.invalid_streak += 1
        if self.invalid_streak > self.error_allowance:
            self.done = True
            return f"Invalid move: {reason}. Too many invalid moves in a row: the game is over."
        return f"Invalid move: {reason}. Please try again."

    def _validate(self, guess_text: str) -> tuple[str | None, str]:
        match = _BRACKETED.search(guess_text or "")
        if match is None:
            return None, "write your guess as a word in square brackets, e.g. [crane]"
        word = match.group(1).lower()
        if len(word) != self.word_length:
            return None, f"'{word}' is not {self.word_length} letters long"
        if word in self.history:
            return None, f"you already guessed '{word}'"
        if word not in self.dictionary:
            return None, f"'{word}' is not in the word list"
        return word, ""

    def step(self, guess_text: str) -> str:
        """Apply one guess; returns the observation text (feedback or a warning)."""
        if self.done:
            return "The game is over."
        word, problem = self._validate(guess_text)
        if word is None:
            return self._invalid(problem)
        self.invalid_streak = 0
        self.history.append(word)
        marks = score_guess(word, self.secret)
        left = self.num_guesses - len(self.history)
        if word == self.secret:
            self.done = self.won = True
        elif left <= 0:
            self.done = True
        return (
            f"You submitted [{word}].\nFeedback:\n{' '.join(word.upper())}\n"
            f"{' '.join(marks)}\nYou have {left} guesses left."
        )
