"""reasoning_gym: the procedural tasks of the reasoning-gym library, scored by the library itself.

Each task comes from ``reasoning_gym.create_dataset(task, size=..., seed=..., **config)``; the prompt
is the entry's question under one of the library's system prompts (which ask for the answer inside
``<answer></answer>``); the reward is the task's own ``score_answer(extract_answer(completion), entry)``.
A completion without answer tags scores what ``score_answer`` gives ``None`` (0 for every task) and is
counted in ``answer_found``. Install with ``pip install 'telescope-envs[reasoning-gym]'``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from telescope.core.env import RewardResult, Rubric, Sample, SingleTurnEnvironment
from telescope.core.env.base import refuse_kwargs_problems
from telescope.core.registry import did_you_mean
from telescope.envs.kwargs import ReasoningGymKwargs

__all__ = ["ReasoningGymEnvironment", "kwargs_problems", "task_names"]

INSTALL = "pip install 'telescope-envs[reasoning-gym]'"


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            f"the reasoning_gym environment needs the reasoning-gym library: {INSTALL}"
        ) from exc
    return reasoning_gym


def task_names() -> list[str]:
    """Every task the installed reasoning-gym registers (``composite`` excluded: list tasks instead)."""
    from reasoning_gym.factory import DATASETS

    _library()
    return sorted(name for name in DATASETS if name != "composite")


def _config_problem(task: str, config: dict[str, Any], seed: int, size: int) -> str | None:
    """Why ``config`` is not a valid configuration of ``task`` (None when it is)."""
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[task][1]
    fields = [f.name for f in dataclasses.fields(config_cls)]
    for key in config:
        if key not in fields or key in ("seed", "size"):
            settable = [f for f in fields if f not in ("seed", "size")]
            hint = " (set seed and size at the top level of kwargs)" if key in ("seed", "size") else ""
            return (
                f"'{key}' is not a config field of reasoning-gym task '{task}'{hint}.{did_you_mean(key, settable)} "
                f"Its fields: {', '.join(settable)}"
            )
    try:
        built = config_cls(**{**config, "seed": seed, "size": size})
        if hasattr(built, "validate"):
            built.validate()
    except Exception as exc:  # noqa: BLE001 - the library validates with asserts and ValueErrors
        return f"reasoning-gym task '{task}' refuses config {config}: {type(exc).__name__}: {exc}"
    return None


def kwargs_problems(kw: ReasoningGymKwargs) -> list[str]:
    """Unknown tasks (with a did-you-mean), bad task configuration, unknown prompt_style."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    known = task_names()
    problems = [
        f"task: '{name}' is not a reasoning-gym task.{did_you_mean(name, known)} "
        "See `telescope envs list` for the installed tasks."
        for name in kw.tasks
        if name not in known
    ]
    if problems:
        return problems
    for task, config in kw.task_configs().items():
        problem = _config_problem(task, config, kw.seed, kw.size)
        if problem is not None:
            problems.append(problem if len(kw.tasks) == 1 else f"{task}: {problem}")
    if kw.prompt_style not in SYSTEM_PROMPTS:
        problems.append(
            f"prompt_style: '{kw.prompt_style}' is not one of reasoning-gym's system prompts: "
            f"{', '.join(SYSTEM_PROMPTS)}"
        )
    return problems


class ReasoningGymEnvironment(SingleTurnEnvironment):
    """One or several reasoning-gym tasks; the reward is the task's own ``score_answer`` (0 to 1)."""

    kwargs_model: ClassVar[type[ReasoningGymKwargs]] = ReasoningGymKwargs  # type: ignore[assignment]
    default_name = "reasoning_gym"
    kwargs_problems = staticmethod(kwargs_problems)
    """What ``config validate`` refuses in these kwargs (``registry_problems`` calls it)."""
    reward_min = 0.0
    reward_max = 1.0

    def __init__(self, kwargs: ReasoningGymKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        kw: ReasoningGymKwargs = self.kwargs  # type: ignore[assignment]
        refuse_kwargs_problems("reasoning_gym", kwargs_problems(kw))
        library = _library()
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self._extract_answer = library.utils.extract_answer
        self.default_system_prompt = SYSTEM_PROMPTS[kw.prompt_style]  # type: ignore[misc]
        self.datasets = {
            task: library.create_dataset(task, **config, seed=kw.seed, size=kw.size)
            for task, config in kw.task_configs().items()
        }
        self.tags_options = {"task": list(self.datasets)}  # type: ignore[misc]
        self.rubric = (
            Rubric(timeout_s=kw.reward_timeout_s)
            .add_reward(self._score, name="score", range_min=0.0, range_max=1.0)
            .add_metric(self._answer_found, name="answer_found", range_min=0.0, range_max=1.0)
        )
        ranges = dict(self.rubric.metrics_ranges)
        if len(self.datasets) > 1:
            ranges.update({f"score/{task}": ranges["score"] for task in self.datasets})
        self.metrics_ranges = ranges  # type: ignore[misc]

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """The tasks' entries interleaved (one of each task in turn), ``size`` per task."""
        kw: ReasoningGymKwargs = self.kwargs  # type: ignore[assignment]
        limits = [n for n in (num_samples, kw.num_samples) if n >= 0]
        count = min([kw.size * len(self.datasets), *limits])
        self._samples = []
        index = 0
        while len(self._samples) < count:
            for task, dataset in self.datasets.items():
                if len(self._samples) == count:
                    break
                entry = dataset[index]
                self._samples.append(
                    Sample(entry["question"], str(entry["answer"]), {"task": task, "entry": entry})
                )
            index += 1
        return self._samples

    def reference_completion(self, sample: Sample) -> str | None:
        return f"<answer>{sample.answer}</answer>"

    def _score(self, completion: str, metadata: dict[str, Any]) -> tuple[float, str]:
        """The task's ``score_answer`` on the last <answer> (None when there is none); the golden answer."""
        entry = metadata["entry"]
        answer = self._extract_answer(completion)
        return float(self.datasets[metadata["task"]].score_answer(answer, entry)), str(entry["answer"])

    def _answer_found(self, completion: str) -> float:
        return float(self._extract_answer(completion) is not None)

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        task = sample.metadata["task"]
        result = await self.rubric.score(
            completion=completion, sample=sample, extra_sample_tags={"task": task}
        )
        if len(self.datasets) > 1:
            result.sample_metrics[f"score/{task}"] = result.sample_metrics["score"]
        return result
