"""Math environments: math-verify on the last ``\\boxed{}`` answer.

``hendrycks_math``, ``dapo_math``, ``deepscaler`` and ``gsm8k`` share one class and differ
only in their default dataset and how a row becomes a ``Sample``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from telescope.core.env import (
    RewardResult,
    Rubric,
    Sample,
    SingleTurnEnvironment,
)
from telescope.core.env.data import load_rows, select_rows
from telescope.core.env.math_check import verify_math_answer
from telescope.core.env.parsers import extract_boxed_answer, strip_think_tags
from telescope.envs.kwargs import MathKwargs

__all__ = [
    "DapoMathEnvironment",
    "DeepScalerEnvironment",
    "Gsm8kEnvironment",
    "HendrycksMathEnvironment",
    "MathEnvironment",
    "MathKwargs",
    "boxed_answer_correct",
]

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in the mind "
    "and then provide the user with the answer."
)
INSTRUCTION = "Show your work and put your final answer within \\boxed{}."


def boxed_answer_correct(completion: str, answer: str) -> tuple[float, str]:
    """1.0 when the last ``\\boxed{}`` after any thinking equals ``answer`` (math-verify)."""
    predicted = extract_boxed_answer(strip_think_tags(completion))
    return (1.0 if predicted and verify_math_answer(predicted, answer) else 0.0), answer


class MathEnvironment(SingleTurnEnvironment):
    """Base of the math environments; subclasses set the dataset (and ``row_to_sample`` when its
    columns are not ``problem`` and ``answer``)."""

    kwargs_model: ClassVar[type[MathKwargs]] = MathKwargs  # type: ignore[assignment]
    default_system_prompt = SYSTEM_PROMPT
    default_instruction_prompt = INSTRUCTION
    default_dataset: ClassVar[str] = ""
    default_subset: ClassVar[str | None] = None
    default_split: ClassVar[str | None] = None
    sample_file: ClassVar[str] = ""
    reward_min = 0.0
    reward_max = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "correct": {"min": 0.0, "max": 1.0, "invert": False}
    }

    def __init__(self, kwargs: MathKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self.rubric = Rubric().add_reward(boxed_answer_correct, name="correct", range_min=0.0, range_max=1.0)

    def read_rows(self) -> list[dict[str, Any]]:
        """Rows from data_files, the shipped sample, or the hub dataset."""
        from telescope.envs.sample_data import sample_path

        kw: MathKwargs = self.kwargs  # type: ignore[assignment]
        own = kw.dataset_name is not None  # another dataset: the defaults below do not apply
        return load_rows(
            dataset_name=kw.dataset_name or self.default_dataset,
            subset=kw.dataset_subset if own else kw.dataset_subset or self.default_subset,
            split=kw.dataset_split or (None if own else self.default_split) or "train",
            data_files=kw.data_files,
            sample_file=sample_path(self.sample_file) if kw.sample_data else None,
            use_sample=kw.sample_data,
        )

    def reference_completion(self, sample: Sample) -> str | None:
        return f"The answer is \\boxed{{{sample.answer}}}."

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        """One dataset row as a Sample (None skips the row); by default the ``problem`` and
        ``answer`` columns (DeepScaleR, AIME 2024): datasets laid out otherwise override it."""
        return Sample(row["problem"], str(row["answer"]), {})

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Samples from the rows that convert, optionally shuffled and cut."""
        kw: MathKwargs = self.kwargs  # type: ignore[assignment]
        samples = [s for s in (self.row_to_sample(r) for r in self.read_rows()) if s is not None]
        limit = num_samples if num_samples >= 0 else kw.num_samples
        self._samples = select_rows(samples, num_samples=limit, shuffle=kw.shuffle, seed=kw.seed)
        return self._samples

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """``correct`` in {0, 1}."""
        return await self.rubric.score(completion=completion, sample=sample)


class HendrycksMathEnvironment(MathEnvironment):
    """MATH (Hendrycks) in the genesys format: ``prompt`` + JSON ``verification_info``."""

    default_name = "hendrycks_math"
    default_dataset = "justus27/math-hendrycks-genesys-format"
    sample_file = "hendrycks_math.jsonl"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        info = row.get("verification_info")
        if not isinstance(row.get("prompt"), str) or not info:
            return None
        truth = (json.loads(info) if isinstance(info, str) else info)["ground_truth"]
        return Sample(row["prompt"], str(truth), {})


class DapoMathEnvironment(MathEnvironment):
    """DAPO-Math-17k: ``prompt[0].content`` + ``reward_model.ground_truth``."""

    default_name = "dapo_math"
    default_dataset = "BytedTsinghua-SIA/DAPO-Math-17k"
    sample_file = "dapo_math.jsonl"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        model = row.get("reward_model")
        model = json.loads(model) if isinstance(model, str) else model
        if not isinstance(model, dict) or "ground_truth" not in model:
            return None
        return Sample(row["prompt"][0]["content"], str(model["ground_truth"]), {})


class DeepScalerEnvironment(MathEnvironment):
    """DeepScaleR-Preview: ``problem`` + ``answer``."""

    default_name = "deepscaler"
    default_dataset = "agentica-org/DeepScaleR-Preview-Dataset"
    sample_file = "deepscaler.jsonl"


class Gsm8kEnvironment(MathEnvironment):
    """GSM8K (``openai/gsm8k``, config main): ``question`` + the number after ``####``."""

    default_name = "gsm8k"
    default_dataset = "openai/gsm8k"
    default_subset = "main"
    sample_file = "gsm8k.jsonl"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
        return Sample(row["question"], final, {"solution": row["answer"]})
