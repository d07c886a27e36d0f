"""Registers ``shout_reverse``; the environment module is imported only when selected."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from telescope.core import hookimpl
from telescope.core.env import SingleTurnKwargs
from telescope.core.registry import Register


class ShoutReverseKwargs(SingleTurnKwargs):
    """Kwargs of shout_reverse."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    num_samples: int = Field(default=100, ge=1)
    """Number of generated words."""
    seed: int = 0
    """Seed of the word draw."""


@hookimpl
def telescope_register_environments(register: Register) -> None:
    register.add(
        "shout_reverse",
        "telescope_example_env.env:ShoutReverseEnvironment",
        kwargs_model=ShoutReverseKwargs,
        description="Spell a word backwards in upper case (example third-party env)",
        multi_turn=False,
    )
