"""The demo tasks of the built-in tiny models, defined once.

``reverse_text`` (telescope-envs) serves this task to the policy, and the builder of
``telescope/tiny-reverse`` warm-starts the model on its solutions, so both must agree on
the words, the system prompt and the answer format: they read them from here.
"""

from __future__ import annotations

import random

__all__ = ["REVERSE_SYSTEM_PROMPT", "REVERSE_WORDS", "reverse_phrase"]

REVERSE_WORDS: tuple[str, ...] = tuple(
    (
        "apple river stone cloud green light table music paper water house smile train glass "
        "night dream bread plant sound ocean tiger lemon chair north quiet story field storm"
    ).split()
)
# Short on purpose: with a one-to-three-word task the system prompt was ~58 of ~80 prompt tokens,
# most of what the quickstart's trainer and server processed (the short one halves its step time).
REVERSE_SYSTEM_PROMPT = "Reverse the text."


def reverse_phrase(rng: random.Random, min_words: int, max_words: int) -> str:
    """A random phrase of ``min_words..max_words`` demo words (its answer is ``phrase[::-1]``)."""
    return " ".join(rng.choice(REVERSE_WORDS) for _ in range(rng.randint(min_words, max_words)))
