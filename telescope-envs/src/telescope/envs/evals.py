"""Dedicated evals: math500, aime_2024, aime_2025, gpqa_diamond.

They are ordinary single-turn environments, so their prompts go through the chat template
like every other prompt (the anchor sent eval prompts as raw text).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from telescope.core.env import RewardResult, Rubric, Sample
from telescope.core.env.data import load_rows
from telescope.core.env.parsers import strip_think_tags
from telescope.envs.math_envs import MathEnvironment

__all__ = ["Aime2024Eval", "Aime2025Eval", "GpqaDiamondEval", "Math500Eval", "extract_choice"]

EVAL_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
_LEVEL = re.compile(r"(\d+)")
_CHOICE = re.compile(r"(?i)Answer\s*:\s*\$?([A-D])\$?")


class _MathEval(MathEnvironment):
    default_system_prompt = None
    default_instruction_prompt = None

    def build_messages(self, sample: Sample) -> list[dict[str, Any]]:
        messages = super().build_messages(sample)
        messages[-1]["content"] = f"{messages[-1]['content']}\n{EVAL_INSTRUCTION}"
        return messages


class Math500Eval(_MathEval):
    """MATH-500 (``HuggingFaceH4/MATH-500``, test): ``correct`` and the problem ``level``."""

    default_name = "math500"
    default_dataset = "HuggingFaceH4/MATH-500"
    default_split = "test"
    sample_file = "math500.jsonl"
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "correct": {"min": 0.0, "max": 1.0, "invert": False},
        "level": {"min": 1.0, "max": 5.0, "invert": False},
    }

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        level = _LEVEL.search(str(row.get("level", "")))
        meta = {"subject": str(row.get("subject", "")), "level": float(level.group(1)) if level else 0.0}
        return Sample(row["problem"], str(row["answer"]), meta)

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return await self.rubric.score(
            completion=completion,
            sample=sample,
            extra_sample_metrics={"level": sample.metadata["level"]},
            extra_sample_tags={"subject": sample.metadata["subject"]},
        )


class Aime2024Eval(_MathEval):
    """AIME 2024 (``HuggingFaceH4/aime_2024``, train)."""

    default_name = "aime_2024"
    default_dataset = "HuggingFaceH4/aime_2024"
    sample_file = "aime_2024.jsonl"


class Aime2025Eval(_MathEval):
    """AIME 2025 (``opencompass/AIME2025``, configs AIME2025-I and AIME2025-II, test)."""

    default_name = "aime_2025"
    default_dataset = "opencompass/AIME2025"
    default_split = "test"
    sample_file = "aime_2025.jsonl"

    def read_rows(self) -> list[dict[str, Any]]:
        kw = self.kwargs
        if kw.dataset_name or kw.data_files or kw.sample_data:  # type: ignore[attr-defined]
            return super().read_rows()
        return [
            row
            for subset in ("AIME2025-I", "AIME2025-II")
            for row in load_rows(dataset_name=self.default_dataset, subset=subset, split="test")
        ]

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        return Sample(row["question"], str(row["answer"]), {})


def extract_choice(text: str) -> str:
    """The letter of the last ``Answer: X`` (A-D), upper-cased; ``""`` if none."""
    matches = _CHOICE.findall(text)
    return matches[-1].upper() if matches else ""


class GpqaDiamondEval(_MathEval):
    """GPQA Diamond (``Idavidrein/gpqa``, gpqa_diamond): choices shuffled with a seeded RNG."""

    default_name = "gpqa_diamond"
    default_dataset = "Idavidrein/gpqa"
    default_subset = "gpqa_diamond"
    sample_file = "gpqa_diamond.jsonl"
    header = (
        "Answer the following multiple choice question. The last line of your response should be "
        "of the following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. "
        "Think step by step before answering."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rng = random.Random(self.kwargs.seed)  # type: ignore[attr-defined]
        self.rubric = Rubric().add_reward(self._correct, name="correct", range_min=0.0, range_max=1.0)

    def build_messages(self, sample: Sample) -> list[dict[str, Any]]:
        return MathEnvironment.build_messages(self, sample)

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        self._rng = random.Random(self.kwargs.seed)  # type: ignore[attr-defined]  # same order every load
        return super().load_dataset(num_samples)

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        choices = [
            row["Correct Answer"],
            row["Incorrect Answer 1"],
            row["Incorrect Answer 2"],
            row["Incorrect Answer 3"],
        ]
        order = list(range(4))
        self._rng.shuffle(order)
        letter = "ABCD"[order.index(0)]
        lines = [self.header, "", str(row["Question"]).strip(), ""]
        lines += [f"{'ABCD'[i]}) {str(choices[j]).strip()}" for i, j in enumerate(order)]
        return Sample("\n".join(lines), letter, {})

    def reference_completion(self, sample: Sample) -> str | None:
        return f"Answer: {sample.answer}"

    def _correct(self, completion: str, answer: str) -> tuple[float, str]:
        return (1.0 if extract_choice(strip_think_tags(completion)) == answer else 0.0), answer
