"""Environments made to fail, for the health sentinel's runs (a local plugin: ``plugins: [this file]``).

- ``reverse_text_lengthy``: reverse_text whose reward also pays for length, a hidden exploit: the
  policy learns to write until max_tokens (``length_blowup``).
- ``reverse_text_constant``: every completion scores 1.0: every group has zero advantage, so no
  step ever fills (``reward_saturated``).
"""

from __future__ import annotations

from telescope.core import hookimpl
from telescope.core.env import RewardResult, Sample
from telescope.core.registry import Register
from telescope.envs.kwargs import ReverseTextKwargs
from telescope.envs.reverse_text import ReverseTextEnvironment, reverse_reward

LENGTH_PAID_CHARS = 60
"""``reverse_text_lengthy`` pays its full length bonus from this many characters on."""


class LengthyReverseText(ReverseTextEnvironment):
    """Reward = 0.2 x LCS ratio + 0.8 x min(characters / LENGTH_PAID_CHARS, 1)."""

    default_name = "reverse_text_lengthy"

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        length = min(len(completion) / LENGTH_PAID_CHARS, 1.0)
        return RewardResult(total_reward=0.2 * reverse_reward(completion, sample.answer) + 0.8 * length)


class ConstantReverseText(ReverseTextEnvironment):
    """Reward 1.0 whatever the completion."""

    default_name = "reverse_text_constant"

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=1.0)


@hookimpl
def telescope_register_environments(register: Register) -> None:
    for name, cls, what in (
        ("reverse_text_lengthy", LengthyReverseText, "reverse_text paying for length (health tests)"),
        ("reverse_text_constant", ConstantReverseText, "reverse_text scoring 1.0 always (health tests)"),
    ):
        register.add(name, cls, kwargs_model=ReverseTextKwargs, description=what, multi_turn=False)
