"""calculator: a ToolEnvironment demo; the model solves arithmetic with add/subtract/multiply/divide.

Reward = correct (final ``<answer>`` equals the value, within 1e-6); tool usage stats are
recorded as sample metrics.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from telescope.core.env import (
    RewardResult,
    RolloutState,
    Rubric,
    Sample,
    ToolEnvironment,
)
from telescope.core.env.parsers import extract_answer_tags, strip_think_tags
from telescope.envs.kwargs import CalculatorKwargs

__all__ = ["CalculatorEnvironment", "CalculatorKwargs", "add", "divide", "multiply", "subtract"]


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return a - b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor (must not be zero).
    """
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a / b


def _number(text: str | None) -> float | None:
    try:
        return float(str(text).replace(",", "").strip())
    except (TypeError, ValueError):
        return None


class CalculatorEnvironment(ToolEnvironment):
    """Arithmetic word problems solved by calling calculator tools."""

    kwargs_model: ClassVar[type[CalculatorKwargs]] = CalculatorKwargs  # type: ignore[assignment]
    tools: ClassVar[list[Any]] = [add, subtract, multiply, divide]
    default_name = "calculator"
    default_system_prompt = (
        "Solve the arithmetic problem using the calculator tools, one step at a time. "
        "When you know the result, reply with it inside <answer></answer> tags."
    )
    reward_min = 0.0
    reward_max = 1.0

    def __init__(self, kwargs: CalculatorKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self.rubric = Rubric().add_reward(self._correct, name="correct", range_min=0.0, range_max=1.0)

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Seeded expressions like ``(12 + 7) * 3``; the answer is their exact value."""
        kw: CalculatorKwargs = self.kwargs  # type: ignore[assignment]
        rng = random.Random(kw.seed)
        count = kw.num_samples if num_samples < 0 else num_samples
        self._samples = []
        for _ in range(count):
            expr, value = str(rng.randint(1, 50)), 0
            value = int(expr)
            for _ in range(kw.num_operations):
                op, n = rng.choice("+-*"), rng.randint(1, 20)
                expr, value = f"({expr} {op} {n})", {"+": value + n, "-": value - n, "*": value * n}[op]
            expr = expr[1:-1] if expr.startswith("(") else expr
            self._samples.append(Sample(f"What is {expr}?", str(value), {"expression": expr}))
        return self._samples

    def reference_completion(self, sample: Sample) -> str | None:
        return f"<answer>{sample.answer}</answer>"

    def _correct(self, state: RolloutState, answer: str) -> tuple[float, str]:
        final = state.assistant_texts()[-1] if state.trajectory else ""
        got, want = _number(extract_answer_tags(strip_think_tags(final))), float(answer)
        return (1.0 if got is not None and abs(got - want) < 1e-6 else 0.0), answer

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        """``correct`` plus the tool metrics."""
        return await self.rubric.score(state=state, extra_sample_metrics=self.get_tool_metrics(state))
