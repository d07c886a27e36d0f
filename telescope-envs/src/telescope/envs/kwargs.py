"""Kwargs models of every telescope-envs environment and eval.

Kept apart from the environment modules so that the plugin (and ``telescope envs list``)
can validate and describe kwargs without importing any environment code.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from telescope.core.env.base import MultiTurnKwargs, SingleTurnKwargs
from telescope.core.env.data import DatasetKwargs
from telescope.core.env.tool_env import ToolEnvironmentKwargs
from telescope.core.sandbox.check import sandbox_provider_problems

__all__ = [
    "CalculatorKwargs",
    "CountdownKwargs",
    "I3CodeKwargs",
    "MathKwargs",
    "ReverseTextKwargs",
    "WordleKwargs",
]


class CountdownKwargs(SingleTurnKwargs, DatasetKwargs):
    """Kwargs of the countdown environment."""

    num_generated: int = Field(default=1000, ge=1, le=1_000_000)
    """Problems to generate when no dataset is given (procedural, seeded)."""
    min_numbers: int = Field(default=3, ge=2, le=6)
    """Fewest numbers per generated problem."""
    max_numbers: int = Field(default=4, ge=2, le=6)
    """Most numbers per generated problem."""
    max_number: int = Field(default=99, ge=2, le=1000)
    """Largest number drawn for a generated problem."""


class ReverseTextKwargs(SingleTurnKwargs):
    """Kwargs of the reverse_text environment."""

    num_generated: int = Field(default=1000, ge=1, le=1_000_000)
    """Number of strings to generate."""
    min_words: int = Field(default=1, ge=1, le=20)
    """Fewest words per string."""
    max_words: int = Field(default=3, ge=1, le=20)
    """Most words per string."""
    seed: int = 0
    """Seed of the generator."""
    num_samples: int = Field(default=-1, ge=-1)
    """Keep at most this many samples (-1 = all)."""


class MathKwargs(SingleTurnKwargs, DatasetKwargs):
    """Kwargs of the math environments (dataset_name null = the environment's default)."""


class WordleKwargs(MultiTurnKwargs):
    """Kwargs of the wordle environment."""

    max_turns: int = Field(default=6, ge=1)
    """Maximum model turns per game."""
    num_samples: int = Field(default=2000, ge=1)
    """Number of games (secret words drawn with the seeded RNG)."""
    seed: int = 0
    """Seed of the secret-word draw."""
    word_list_file: str | None = None
    """A file with one five-letter word per line: the secrets (null = the shipped 471-word list)."""
    guess_list_file: str | None = None
    """A file with one five-letter word per line: the valid guesses, besides the secrets (null = the
    shipped 4667-word list from SCOWL via Debian's wamerican; see data/wordle_guesses.LICENSE)."""


class CalculatorKwargs(ToolEnvironmentKwargs):
    """Kwargs of the calculator environment."""

    max_turns: int = Field(default=8, ge=1)
    """Maximum model turns (tool rounds plus the final answer)."""
    num_samples: int = Field(default=1000, ge=1)
    """Number of generated problems."""
    num_operations: int = Field(default=2, ge=1, le=6)
    """Operations per generated expression."""
    seed: int = 0
    """Seed of the problem generator."""


class I3CodeKwargs(SingleTurnKwargs, DatasetKwargs):
    """Kwargs of the i3_code environment."""

    dataset_subset: str | None = "code"
    """Dataset configuration (INTELLECT-3-RL: 'code')."""
    difficulty_key: str | None = None
    """Row field holding a difficulty in [0, 1] to filter on (null = no filter)."""
    min_difficulty: float = 0.0
    """Keep rows with difficulty >= this."""
    max_difficulty: float = 1.0
    """Keep rows with difficulty <= this."""
    max_num_tests: int = Field(default=15, ge=1)
    """At most this many tests per task (a seeded subset, chosen at load time)."""
    timeout_per_test: float = Field(default=10.0, gt=0)
    """Seconds each test may run."""
    provider: str = "local"
    """Sandbox provider name (a registered sandbox_provider, e.g. local)."""
    provider_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Kwargs of the sandbox provider, validated by its own model."""
    pool_size: int = Field(default=4, ge=0)
    """Warm sandboxes kept ready."""
    memory_mb: int | None = Field(default=None, ge=16)
    """Memory per sandbox (MiB); null = the provider's default (set only what the provider can honour:
    E2B takes resources from its template, Modal has no disk limit)."""
    cpu: float | None = Field(default=None, gt=0)
    """CPU cores per sandbox; null = the provider's default."""
    disk_size_gb: float | None = Field(default=None, gt=0)
    """Disk per sandbox (GB); null = the provider's default."""
    docker_image: str = ""
    """Container image for cloud providers (empty = the provider's default)."""
    timeout_minutes: int = Field(default=60, ge=1)
    """Sandbox lifetime."""
    runner_workers: int = Field(default=4, ge=1)
    """Tests run in parallel inside one sandbox."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per completion when the sandbox infrastructure fails."""
    reward_timeout_s: float = Field(default=900.0, gt=0)
    """Seconds scoring one completion may take (sandbox wait + all attempts) before it scores 0."""

    def registry_problems(self, registry: Any) -> list[str]:
        """The sandbox provider must be registered and available, and its kwargs valid."""
        return sandbox_provider_problems(registry, self.provider, self.provider_kwargs)
