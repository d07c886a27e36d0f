"""Countdown: combine the given numbers with + - * / to reach a target (TinyZero-style).

Reward = format (0, 0.5 or 1) + equation (0 or 1); reward_max 2.0.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from telescope.core.env import (
    RewardResult,
    Rubric,
    Sample,
    SingleTurnEnvironment,
)
from telescope.core.env.data import load_rows, select_rows
from telescope.envs.kwargs import CountdownKwargs
from telescope.envs.safe_arith import MAX_EXPRESSION_CHARS, UnsafeExpression, safe_arithmetic

__all__ = [
    "CountdownEnvironment",
    "CountdownKwargs",
    "combine",
    "equation_reward",
    "format_reward",
    "generate_problem",
]

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in the mind "
    "and then provide the user with the answer."
)
INSTRUCTION = (
    "Show your work in <think> </think> tags. And return the final equation and answer in "
    "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
QUESTION = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once."
)
_FORMAT = re.compile(r"^<think>((?:(?!</?think>).)*)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARITH_CHARS = re.compile(r"^[\d+\-*/().\s]+$")


def format_reward(completion: str) -> float:
    """1.0: ``<think>..</think><answer>arithmetic</answer>``; 0.5: right tags, other answer; else 0."""
    text = completion.lstrip()
    if not text.startswith("<think>"):
        text = "<think>" + text
    match = _FORMAT.match(text)
    if match is None:
        return 0.0
    return 1.0 if _ARITH_CHARS.match(match.group(2)) else 0.5


def equation_reward(completion: str, nums: list[int], target: float) -> float:
    """1.0 when the last ``<answer>`` uses each number exactly once and equals ``target``."""
    answers = _ANSWER.findall(completion)
    if not answers:
        return 0.0
    equation = answers[-1].strip()
    if len(equation) > MAX_EXPRESSION_CHARS or not _ARITH_CHARS.match(equation):
        return 0.0
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(nums):
        return 0.0
    try:
        value = safe_arithmetic(equation)
    except (UnsafeExpression, ZeroDivisionError, OverflowError):
        return 0.0
    return 1.0 if abs(value - float(target)) < 1e-5 else 0.0


def combine(numbers: list[int], rng: random.Random) -> tuple[int, str]:
    """``numbers`` combined left to right with random operators (``/`` only when exact, ``*`` up to
    10 000, ``-`` only while positive, else ``+``): the value and its expression, e.g. ``(3 + 5) * 2``."""
    value, expression = numbers[0], str(numbers[0])
    for n in numbers[1:]:
        op = rng.choice("+-*/")
        if op == "/" and value % n == 0:
            value //= n
        elif op == "*" and value * n <= 10_000:
            value *= n
        elif op == "-" and value > n:
            value -= n
        else:
            op, value = "+", value + n
        expression = f"{f'({expression})' if ' ' in expression else expression} {op} {n}"
    return value, expression


def generate_problem(rng: random.Random, count: int, max_number: int) -> tuple[list[int], int]:
    """Numbers and a reachable positive integer target (built from a random expression)."""
    while True:
        nums = [rng.randint(1, max_number) for _ in range(count)]
        order = nums[:]
        rng.shuffle(order)
        value, _ = combine(order, rng)
        if 1 <= value <= 10_000:
            return nums, value


class CountdownEnvironment(SingleTurnEnvironment):
    """Countdown numbers game; procedural by default, or ``Jiayi-Pan/Countdown-Tasks-3to4``."""

    kwargs_model: ClassVar[type[CountdownKwargs]] = CountdownKwargs  # type: ignore[assignment]
    default_name = "countdown"
    default_system_prompt = SYSTEM_PROMPT
    default_instruction_prompt = INSTRUCTION
    reward_min = 0.0
    reward_max = 2.0

    def __init__(self, kwargs: CountdownKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self.rubric = Rubric()
        self.rubric.add_reward(self._format, name="format", range_min=0.0, range_max=1.0)
        self.rubric.add_reward(self._equation, name="equation", range_min=0.0, range_max=1.0)

    @property
    def metrics_ranges(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return self.rubric.metrics_ranges

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Generated problems, or rows with ``nums`` and ``target`` from a dataset."""
        kw: CountdownKwargs = self.kwargs  # type: ignore[assignment]
        if kw.dataset_name or kw.data_files or kw.sample_data:
            from telescope.envs.sample_data import sample_path

            rows = load_rows(
                dataset_name=kw.dataset_name,
                subset=kw.dataset_subset,
                split=kw.dataset_split or "train",
                data_files=kw.data_files,
                sample_file=sample_path("countdown.jsonl"),
                use_sample=kw.sample_data,
            )
            problems = [([int(n) for n in r["nums"]], int(r["target"])) for r in rows]
        else:
            if kw.min_numbers > kw.max_numbers:
                raise ValueError(
                    f"countdown: min_numbers ({kw.min_numbers}) > max_numbers ({kw.max_numbers})"
                )
            rng = random.Random(kw.seed)
            problems = [
                generate_problem(rng, rng.randint(kw.min_numbers, kw.max_numbers), kw.max_number)
                for _ in range(kw.num_generated)
            ]
        limit = num_samples if num_samples >= 0 else kw.num_samples
        problems = select_rows(problems, num_samples=limit, shuffle=kw.shuffle, seed=kw.seed)
        self._samples = [
            Sample(QUESTION.format(nums=nums, target=target), str(target), {"nums": nums, "target": target})
            for nums, target in problems
        ]
        return self._samples

    def _format(self, completion: str) -> float:
        return format_reward(completion)

    def _equation(self, completion: str, sample: Sample) -> tuple[float, str]:
        meta = sample.metadata
        return equation_reward(completion, list(meta["nums"]), meta["target"]), str(meta["target"])

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """Format + equation rewards on the completion."""
        return await self.rubric.score(completion=completion, sample=sample)
