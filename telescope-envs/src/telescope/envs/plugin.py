"""Telescope plugin of telescope-envs: registers its environments and evals.

Factories are import strings (nothing loads until a run selects the environment); kwargs
models come from the light ``telescope.envs.kwargs`` module.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from telescope.core import hookimpl
from telescope.core.registry import Register

_MATH_INSTALL = "pip install 'telescope-envs[math]'"


def _missing(module: str, install: str) -> str | None:
    """Why a component cannot run here (its dependency is not installed), or None."""
    return None if find_spec(module) is not None else f"needs {module}: {install}"


def _math_meta() -> dict[str, Any]:
    return {
        "requires": ["math-verify"],
        "install": _MATH_INSTALL,
        "unavailable": _missing("math_verify", _MATH_INSTALL),
    }


def _hub_meta() -> dict[str, Any]:
    return {"optional": ["datasets"], "optional_install": "pip install 'telescope-envs[datasets]'"}


@hookimpl
def telescope_register_environments(register: Register) -> None:
    from telescope.envs import kwargs as kw

    base = "telescope.envs."
    register.add(
        "countdown",
        base + "countdown:CountdownEnvironment",
        kwargs_model=kw.CountdownKwargs,
        description="Countdown numbers game (procedural; format + equation reward, max 2.0)",
        multi_turn=False,
        **_hub_meta(),
    )
    register.add(
        "reverse_text",
        base + "reverse_text:ReverseTextEnvironment",
        kwargs_model=kw.ReverseTextKwargs,
        description="Reverse a short string (procedural; LCS ratio reward)",
        multi_turn=False,
    )
    for name, cls, what in (
        ("hendrycks_math", "HendrycksMathEnvironment", "MATH (Hendrycks)"),
        ("dapo_math", "DapoMathEnvironment", "DAPO-Math-17k"),
        ("deepscaler", "DeepScalerEnvironment", "DeepScaleR-Preview"),
        ("gsm8k", "Gsm8kEnvironment", "GSM8K"),
    ):
        register.add(
            name,
            f"{base}math_envs:{cls}",
            kwargs_model=kw.MathKwargs,
            description=f"{what}: math-verify on the last \\boxed{{}}",
            multi_turn=False,
            **_math_meta(),
            **_hub_meta(),
        )
    register.add(
        "wordle",
        base + "wordle:WordleEnvironment",
        kwargs_model=kw.WordleKwargs,
        description="Wordle with a shipped word list (multi-turn, max reward 2.2)",
        multi_turn=True,
    )
    register.add(
        "calculator",
        base + "calculator:CalculatorEnvironment",
        kwargs_model=kw.CalculatorKwargs,
        description="Arithmetic with calculator tools (ToolEnvironment demo)",
        multi_turn=True,
        tools=True,
    )
    register.add(
        "i3_code",
        base + "i3_code:I3CodeEnvironment",
        kwargs_model=kw.I3CodeKwargs,
        description="INTELLECT-3 code tasks, tests run in a sandbox (kwargs.provider)",
        multi_turn=False,
        requires=["a sandbox provider (telescope-sandboxes)"],
        **_hub_meta(),
    )


@hookimpl
def telescope_register_evals(register: Register) -> None:
    from telescope.envs import kwargs as kw

    for name, cls, what in (
        ("math500", "Math500Eval", "MATH-500"),
        ("aime_2024", "Aime2024Eval", "AIME 2024"),
        ("aime_2025", "Aime2025Eval", "AIME 2025 (I and II)"),
        ("gpqa_diamond", "GpqaDiamondEval", "GPQA Diamond (multiple choice)"),
    ):
        meta = _hub_meta() if name == "gpqa_diamond" else {**_math_meta(), **_hub_meta()}
        register.add(
            name,
            f"telescope.envs.evals:{cls}",
            kwargs_model=kw.MathKwargs,
            description=f"{what} eval",
            multi_turn=False,
            **meta,
        )
