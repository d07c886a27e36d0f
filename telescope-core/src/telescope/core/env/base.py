"""Environment base classes and the kwargs models every environment extends."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from telescope.core.env import reward_log
from telescope.core.env.chat import ChatOptions, render_messages
from telescope.core.env.compaction import Compactor
from telescope.core.env.parsers import strip_eos
from telescope.core.env.types import (
    ChatMessage,
    EvalMetricsResult,
    RewardResult,
    RolloutState,
    Sample,
    info_turn,
)
from telescope.core.infra import infra_cause

__all__ = [
    "ConversationEnvironment",
    "Environment",
    "EnvironmentKwargs",
    "MultiTurnEnvironment",
    "MultiTurnKwargs",
    "SingleTurnEnvironment",
    "SingleTurnKwargs",
]


class EnvironmentKwargs(BaseModel):
    """Kwargs every environment accepts; subclass it (unknown keys are config errors)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    system_prompt: str | None = None
    """System message sent before the task (null = none, or the environment's default)."""
    reward_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds a whole reward computation may take before it scores 0 (reward_timeout)."""

    def registry_problems(self, registry: Any) -> list[str]:
        """Problems only the installed plugins can reveal (``config validate`` calls this);
        one line each, naming the kwarg (e.g. an unknown sandbox provider). Default: none."""
        return []


def refuse_kwargs_problems(env_name: str, problems: list[str]) -> None:
    """Raise ``ValueError`` naming ``env_name`` and each of ``problems`` (what ``registry_problems``
    reports at ``config validate``), so an environment built without that check fails as clearly."""
    if problems:
        raise ValueError(f"{env_name}: " + "; ".join(problems))


class SingleTurnKwargs(EnvironmentKwargs):
    """Kwargs of single-turn environments."""

    instruction_prompt: str | None = None
    """Text placed before the question in the user message (null = the environment's default)."""
    add_thinking_prefix: bool = False
    """Start the assistant turn with '<think>' so the model continues its reasoning."""


class MultiTurnKwargs(EnvironmentKwargs):
    """Kwargs of multi-turn environments."""

    max_turns: int = Field(default=10, ge=1)
    """Maximum number of model turns per rollout."""


class Environment(ABC):
    """A task: a dataset of ``Sample``s and a reward.

    Subclasses set ``kwargs_model`` and implement ``load_dataset`` and ``compute_reward``.
    The registry name is the one canonical identifier (``name``), set by the factory.
    """

    kwargs_model: ClassVar[type[EnvironmentKwargs]] = EnvironmentKwargs
    default_name: ClassVar[str] = ""
    default_system_prompt: ClassVar[str | None] = None
    eos_token: str = "<|endoftext|>"
    """Stop text assumed when the host passes none (``score(..., eos_token="")``)."""
    strip_stop_text: ClassVar[bool] = True
    """EOS rule: ``compute_reward`` gets single-turn completions with the trailing stop text
    (``eos_token``) removed. Set False to receive the raw text (then strip it yourself)."""
    reward_min: float | None = None
    reward_max: float | None = None
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {}
    tags_options: ClassVar[dict[str, list[str]]] = {}
    is_multi_turn: ClassVar[bool] = False

    def __init__(self, kwargs: EnvironmentKwargs | None = None, *, name: str | None = None) -> None:
        if kwargs is None:
            kwargs = self.kwargs_model()
        if not isinstance(kwargs, self.kwargs_model):
            raise TypeError(
                f"{type(self).__name__} takes kwargs of type {self.kwargs_model.__name__}, "
                f"got {type(kwargs).__name__}"
            )
        self.kwargs = kwargs
        self.name = name or self.default_name or type(self).__name__
        self._samples: list[Sample] | None = None

    @classmethod
    def from_kwargs(cls, kwargs: EnvironmentKwargs | None = None, **extra: Any) -> Environment:
        """Registry factory: ``factory(kwargs=<validated model>)``."""
        return cls(kwargs, **extra)

    @property
    def system_prompt(self) -> str | None:
        """The configured system prompt, else the environment's default."""
        configured = self.kwargs.system_prompt
        return configured if configured is not None else self.default_system_prompt

    @abstractmethod
    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Return the samples (the first ``num_samples``; -1 = all) and keep them."""

    def samples(self) -> list[Sample]:
        """The loaded samples (loads them on first use)."""
        if self._samples is None:
            self._samples = self.load_dataset()
        return self._samples

    def get_sample(self, idx: int) -> Sample:
        """Sample ``idx`` of the loaded dataset."""
        return self.samples()[idx]

    def __len__(self) -> int:
        return len(self.samples())

    def reference_completion(self, sample: Sample) -> str | None:
        """A reply that should earn a high reward on ``sample`` (``telescope env check`` scores it
        against a junk reply); multi-turn: the reply sent at every turn. None: the environment has none."""
        return None

    async def prepare_resources(self) -> None:  # noqa: B027 - optional hook
        """Start anything the reward needs (sandbox pools, ...) before rollouts begin."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``prepare_resources`` started."""

    async def score(self, target: str | RolloutState, sample: Sample, eos_token: str = "") -> RewardResult:
        """``compute_reward`` under the ``reward_timeout_s`` deadline; never raises.

        ``target`` is the completion text (single-turn) or the rollout state (multi-turn).
        A failure scores 0 with ``reward_error``/``reward_timeout`` set; an infrastructure failure
        (``telescope.core.infra.infra_cause``: a sandbox that could not be created, ...) is raised
        instead, never scored: the sample is retried or masked (``rollouts/outcomes.py``).
        """
        timeout = self.kwargs.reward_timeout_s
        token = reward_log.scoring(self)
        try:
            async with asyncio.timeout(timeout):  # in this task: wait_for would start one per sample
                return await self._reward_call(target, sample, eos_token)
        except TimeoutError:
            message = f"compute_reward took longer than {timeout}s"
            reward_log.report("compute_reward", None, message)
            return _failed_reward("reward_timeout", message)
        except Exception as exc:  # rewards never crash a run, but are logged and counted
            if infra_cause(exc) is not None:
                raise
            reward_log.report("compute_reward", exc)
            return _failed_reward("reward_error", f"{type(exc).__name__}: {exc}")
        finally:
            reward_log.reset(token)

    async def evaluate(
        self, target: str | RolloutState, sample: Sample, eos_token: str = ""
    ) -> EvalMetricsResult:
        """``compute_eval_metrics`` with the same guarantees as ``score`` (an infrastructure failure
        is raised, never scored: the eval runs it again or leaves it out, ``evals/runner.py``)."""
        try:
            async with asyncio.timeout(self.kwargs.reward_timeout_s):
                return await self._eval_call(target, sample, eos_token)
        except Exception as exc:  # includes timeouts
            if infra_cause(exc) is not None:
                raise
            failed = _failed_reward("reward_error", f"{type(exc).__name__}: {exc}")
            return EvalMetricsResult(metrics=failed.sample_metrics, info_turns=failed.info_turns)

    def _completion_text(self, target: Any, eos_token: str) -> Any:
        """The completion as ``compute_reward`` sees it (the EOS rule, see ``strip_stop_text``)."""
        if isinstance(target, str) and self.strip_stop_text:
            return strip_eos(target, eos_token or self.eos_token)
        return target

    async def _reward_call(self, target: Any, sample: Sample, eos_token: str) -> RewardResult:
        text = self._completion_text(target, eos_token)
        return await self.compute_reward(text, sample, eos_token)  # type: ignore[call-arg]

    async def _eval_call(self, target: Any, sample: Sample, eos_token: str) -> EvalMetricsResult:
        text = self._completion_text(target, eos_token)
        return await self.compute_eval_metrics(text, sample, eos_token)  # type: ignore[call-arg]

    @abstractmethod
    async def compute_reward(self, *args: Any, **kwargs: Any) -> RewardResult:
        """Score one completion (single-turn) or one rollout (multi-turn)."""

    async def compute_eval_metrics(self, *args: Any, **kwargs: Any) -> EvalMetricsResult:
        """Eval metrics; by default the reward's sample metrics."""
        result = await self.compute_reward(*args, **kwargs)
        return EvalMetricsResult(
            metrics=dict(result.sample_metrics),
            golden_answers=result.golden_answers,
            info_turns=result.info_turns,
            sample_tags=result.sample_tags,
        )


def _failed_reward(
    key: str, message: str, counted: tuple[str, str] = ("reward_error", "reward_timeout")
) -> RewardResult:
    """A 0 reward counting the failure ``key`` (one of ``counted``, the other recorded as 0)."""
    metrics = dict.fromkeys(counted, 0.0)
    metrics[key] = 1.0
    return RewardResult(0.0, metrics, info_turns=[info_turn(key, message, kind="stderr")])


class SingleTurnEnvironment(Environment):
    """One prompt, one completion, one reward."""

    kwargs_model: ClassVar[type[EnvironmentKwargs]] = SingleTurnKwargs
    default_instruction_prompt: ClassVar[str | None] = None

    @property
    def instruction_prompt(self) -> str | None:
        """The configured instruction, else the environment's default."""
        configured = getattr(self.kwargs, "instruction_prompt", None)
        return configured if configured is not None else self.default_instruction_prompt

    def build_messages(self, sample: Sample) -> list[ChatMessage]:
        """System prompt (optional), then the user message (instruction + question)."""
        messages: list[ChatMessage] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        if isinstance(sample.prompt, list):
            return messages + [dict(m) for m in sample.prompt]
        instruction = self.instruction_prompt
        content = f"{instruction}\n\n{sample.prompt}" if instruction else str(sample.prompt)
        messages.append({"role": "user", "content": content})
        return messages

    def format_prompt(
        self,
        sample: Sample,
        tokenizer: Any,
        chat: ChatOptions | None = None,
        *,
        add_thinking_prefix: bool | None = None,
    ) -> str:
        """The prompt text for ``sample`` through ``tokenizer``'s chat template."""
        messages = self.build_messages(sample)
        prefix = (
            getattr(self.kwargs, "add_thinking_prefix", False)
            if add_thinking_prefix is None
            else add_thinking_prefix
        )
        if prefix:
            messages.append({"role": "assistant", "content": "<think>"})
        return render_messages(tokenizer, messages, chat, continue_final_message=bool(prefix))

    @abstractmethod
    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:  # type: ignore[override]
        """Score one completion of ``sample``."""


class ConversationEnvironment(Environment):
    """An environment whose rollouts are conversations of several model turns (multi-turn, agents)."""

    is_multi_turn: ClassVar[bool] = True

    @property
    def max_turns(self) -> int:
        """Turn limit from the kwargs."""
        return int(getattr(self.kwargs, "max_turns", 10))

    def get_initial_prompt(self, sample: Sample) -> list[ChatMessage]:
        """System prompt (optional), then the sample's prompt as messages."""
        messages: list[ChatMessage] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        if isinstance(sample.prompt, list):
            return messages + [dict(m) for m in sample.prompt]
        return messages + [{"role": "user", "content": str(sample.prompt)}]

    def format_messages(
        self, messages: list[ChatMessage], tokenizer: Any, chat: ChatOptions | None = None
    ) -> str:
        """Render a turn's messages with a generation prompt."""
        return render_messages(tokenizer, messages, chat)

    def compactor(self) -> Compactor:
        """How this environment's conversations are compacted (``context_compaction_at_tokens``):
        override to return a ``Compactor`` subclass with your own summary request or restart."""
        return Compactor()


class MultiTurnEnvironment(ConversationEnvironment):
    """A conversation: the environment answers each model turn until ``is_done``."""

    kwargs_model: ClassVar[type[EnvironmentKwargs]] = MultiTurnKwargs

    def create_initial_state(self, sample: Sample) -> RolloutState:
        """A fresh state for one rollout of ``sample``."""
        return RolloutState(sample=sample, env_name=self.name)

    @abstractmethod
    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        """The environment's reply to the latest assistant message (may be ``[]``)."""

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        """Whether the rollout ends now, and why."""
        if state.num_turns >= self.max_turns:
            return True, "max_turns_reached"
        return False, None

    def get_next_prompt_messages(
        self, state: RolloutState, env_messages: list[ChatMessage]
    ) -> list[ChatMessage]:
        """The next turn's prompt: the conversation so far plus the environment's reply."""
        return [*state.last_messages(), *env_messages]

    @abstractmethod
    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:  # type: ignore[override]
        """Score a finished rollout."""

    async def _reward_call(self, target: Any, sample: Sample, eos_token: str) -> RewardResult:
        return await self.compute_reward(target, eos_token)

    async def _eval_call(self, target: Any, sample: Sample, eos_token: str) -> EvalMetricsResult:
        return await self.compute_eval_metrics(target, eos_token)
