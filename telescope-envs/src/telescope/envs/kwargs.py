"""Kwargs models of every telescope-envs environment and eval.

Kept apart from the environment modules so that the plugin (and ``telescope envs list``)
can validate and describe kwargs without importing any environment code.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from telescope.core.env.agent import AgentKwargs
from telescope.core.env.base import MultiTurnKwargs, SingleTurnKwargs
from telescope.core.env.data import DatasetKwargs
from telescope.core.env.tool_env import ToolEnvironmentKwargs
from telescope.core.registry import did_you_mean
from telescope.core.sandbox.check import sandbox_provider_problems

__all__ = [
    "CalculatorKwargs",
    "CountdownKwargs",
    "I3CodeKwargs",
    "MathKwargs",
    "OpenEnvKwargs",
    "ReasoningGymKwargs",
    "ReverseTextKwargs",
    "VerifiersKwargs",
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
    response_prefix: str = ""
    """Text the answer starts with, written after the prompt (a prefill the model continues), e.g.
    "```python\n" to open the code block; the reward reads prefix + completion, so a block the prefix
    opened and the turn ended inside is the code (it runs, and fails if it is incomplete)."""

    @model_validator(mode="after")
    def _one_prefix(self) -> I3CodeKwargs:
        if self.response_prefix and self.add_thinking_prefix:
            raise ValueError(
                "i3_code: response_prefix and add_thinking_prefix both start the answer; set one "
                f"(response_prefix={self.response_prefix!r}, add_thinking_prefix=true)"
            )
        return self

    def registry_problems(self, registry: Any) -> list[str]:
        """The sandbox provider must be registered and available, and its kwargs valid."""
        return sandbox_provider_problems(registry, self.provider, self.provider_kwargs)


class ReasoningGymKwargs(SingleTurnKwargs):
    """Kwargs of the reasoning_gym environment: tasks of the reasoning-gym library, scored by its own
    ``score_answer``. Any other key is task configuration: with one task, the fields of its config
    (e.g. ``max_terms: 3`` for basic_arithmetic); with several, ``NAME: {fields}`` per task."""

    model_config = ConfigDict(extra="allow")

    task: str | list[str] = "basic_arithmetic"
    """A reasoning-gym task name, or a list of them (`telescope envs list` shows the installed ones)."""
    size: int = Field(default=500, ge=1, le=1_000_000)
    """Samples generated per task."""
    seed: int = 0
    """Seed of every task's generator (adding a task leaves the others' samples unchanged)."""
    prompt_style: str = "default"
    """reasoning-gym's system prompt asking for the answer in <answer></answer> (SYSTEM_PROMPTS key)."""
    num_samples: int = Field(default=-1, ge=-1)
    """Keep at most this many samples over all tasks (-1 = all)."""

    @field_validator("task")
    @classmethod
    def _tasks_named(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names or any(not n for n in names):
            raise ValueError("name at least one reasoning-gym task, e.g. task: basic_arithmetic")
        if len(set(names)) != len(names):
            raise ValueError(f"a task is named twice in {names}")
        return value

    @model_validator(mode="after")
    def _configs_shaped(self) -> ReasoningGymKwargs:
        self.task_configs()
        return self

    @property
    def tasks(self) -> list[str]:
        """The task names, in order."""
        return [self.task] if isinstance(self.task, str) else list(self.task)

    def task_configs(self) -> dict[str, dict[str, Any]]:
        """Each task's configuration from the extra keys (shape checked; fields are checked against
        the library by ``registry_problems``). Raises ValueError naming a misplaced key."""
        extra = dict(self.model_extra or {})
        tasks = self.tasks
        if len(tasks) == 1:
            return {tasks[0]: extra}
        configs: dict[str, dict[str, Any]] = {name: {} for name in tasks}
        for key, value in extra.items():
            if key not in configs:
                raise ValueError(
                    f"'{key}' is not one of the tasks {tasks}.{did_you_mean(key, tasks)} With several "
                    f"tasks, each other key names one of them and holds its config, e.g. {tasks[0]}: "
                    "{field: value}"
                )
            if not isinstance(value, dict):
                raise ValueError(f"{key}: must be a mapping of {key}'s config fields, got {value!r}")
            configs[key] = dict(value)
        return configs

    def registry_problems(self, registry: Any) -> list[str]:
        """Task names, task configuration and prompt_style checked against the installed library."""
        return _env_class(registry, "reasoning_gym").kwargs_problems(self)


class VerifiersKwargs(AgentKwargs):
    """Kwargs of the verifiers environment: a taskset of PrimeIntellect's verifiers (v1 stack), its tasks
    as prompts, its model calls through the run's gateway, its own rewards and metrics."""

    taskset: str = ""
    """A verifiers taskset id: an installed module or package exporting one vf.Taskset subclass in __all__."""
    taskset_args: dict[str, Any] = Field(default_factory=dict)
    """Fields of the taskset's config (its TasksetConfig subclass), validated by verifiers."""
    num_samples: int = Field(default=-1, ge=-1)
    """Take at most this many tasks (-1 = all; needed for an infinite taskset)."""

    def registry_problems(self, registry: Any) -> list[str]:
        """The taskset must load and use only what this adapter supports (each refusal names the feature)."""
        return _env_class(registry, "verifiers").kwargs_problems(self)


class OpenEnvKwargs(AgentKwargs):
    """Kwargs of the openenv environment: an OpenEnv environment server (reset/step over its WebSocket
    protocol), played by the model turn by turn through the run's gateway; the reward is the server's."""

    url: str | None = None
    """Base URL of a running OpenEnv server (http://host:port); null = start `app` locally."""
    app: str | None = None
    """`module:attribute` of an OpenEnv server app (openenv's create_app(...)), started on a free loopback port."""
    action_field: str = "message"
    """The action field that receives the model's reply text (the action is {action_field: text})."""
    observation_field: str | None = None
    """The observation field sent to the model as the next user message (null = every field as JSON)."""
    num_samples: int = Field(default=100, ge=1)
    """Episodes per epoch; episode i resets the environment with seed + i."""
    seed: int = 0
    """Seed of the first episode's reset."""
    step_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds one reset or step may take."""

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvKwargs:
        if (self.url is None) == (self.app is None):
            raise ValueError(
                "set exactly one of url (a running OpenEnv server) and app (module:attribute of its app, "
                f"started locally); got url={self.url!r}, app={self.app!r}"
            )
        if self.app is not None and ":" not in self.app:
            raise ValueError(f"app: '{self.app}' must be module:attribute, e.g. my_env.server.app:app")
        return self

    def registry_problems(self, registry: Any) -> list[str]:
        """``app`` must import (nothing starts: the server is started before the first rollout)."""
        if self.app is None:
            return []
        try:
            load_app(self.app)
        except Exception as exc:  # noqa: BLE001 - any import failure of the user's app, named
            return [f"app: '{self.app}' does not import: {type(exc).__name__}: {exc}"]
        return []


def _env_class(registry: Any, name: str) -> Any:
    """The environment class the registry holds under ``name`` (its module loads only now: the
    library checks live beside the environment, and this module stays import-light)."""
    return registry.get("environment", name).load_factory()


def load_app(spec: str) -> Any:
    """The object ``module:attribute`` names (an OpenEnv server app)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"app: module '{module_name}' has no '{attr}'") from None
