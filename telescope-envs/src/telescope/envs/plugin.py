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


def _library_meta(extra: str, module: str, pip_name: str, *more_modules: str) -> dict[str, Any]:
    """An environment of another library: listed as unavailable, with the install command, without it."""
    install = f"pip install 'telescope-envs[{extra}]'"
    missing = [m for m in (_missing(name, install) for name in (module, *more_modules)) if m]
    return {"requires": [pip_name], "install": install, "unavailable": missing[0] if missing else None}


def _hub_meta() -> dict[str, Any]:
    return {"optional": ["datasets"], "optional_install": "pip install 'telescope-envs[datasets]'"}


def _add(
    register: Register, name: str, factory: str, kwargs_model: Any, description: str, **meta: Any
) -> None:
    """Register one of this package's components: ``factory`` is ``module:Class`` under ``telescope.envs``."""
    meta.setdefault("multi_turn", False)
    register.add(
        name, f"telescope.envs.{factory}", kwargs_model=kwargs_model, description=description, **meta
    )


@hookimpl
def telescope_register_environments(register: Register) -> None:
    from telescope.envs import kwargs as kw

    _add(
        register,
        "countdown",
        "countdown:CountdownEnvironment",
        kw.CountdownKwargs,
        "Countdown numbers game (procedural; format + equation reward, max 2.0)",
        **_hub_meta(),
    )
    _add(
        register,
        "reverse_text",
        "reverse_text:ReverseTextEnvironment",
        kw.ReverseTextKwargs,
        "Reverse a short string (procedural; LCS ratio reward)",
    )
    for name, cls, what in (
        ("hendrycks_math", "HendrycksMathEnvironment", "MATH (Hendrycks)"),
        ("dapo_math", "DapoMathEnvironment", "DAPO-Math-17k"),
        ("deepscaler", "DeepScalerEnvironment", "DeepScaleR-Preview"),
        ("gsm8k", "Gsm8kEnvironment", "GSM8K"),
    ):
        description = f"{what}: math-verify on the last \\boxed{{}}"
        _add(register, name, f"math_envs:{cls}", kw.MathKwargs, description, **_math_meta(), **_hub_meta())
    _add(
        register,
        "wordle",
        "wordle:WordleEnvironment",
        kw.WordleKwargs,
        "Wordle with a shipped word list (multi-turn, max reward 2.2)",
        multi_turn=True,
    )
    _add(
        register,
        "calculator",
        "calculator:CalculatorEnvironment",
        kw.CalculatorKwargs,
        "Arithmetic with calculator tools (ToolEnvironment demo)",
        multi_turn=True,
        tools=True,
    )
    _add(
        register,
        "reasoning_gym",
        "reasoning_gym_env:ReasoningGymEnvironment",
        kw.ReasoningGymKwargs,
        "reasoning-gym's procedural tasks (kwargs.task), scored by the library's own score_answer",
        **_library_meta("reasoning-gym", "reasoning_gym", "reasoning-gym"),
        choices={"task": "telescope.envs.reasoning_gym_env:task_names"},
    )
    for name, factory, kwargs_model, description, pip_name, module, example in (
        (
            "verifiers",
            "verifiers_env:VerifiersEnvironment",
            kw.VerifiersKwargs,
            "a verifiers taskset (kwargs.taskset), its model calls through the gateway, its own rewards",
            "verifiers==0.4.0",
            "verifiers",
            {},
        ),
        (
            "openenv",
            "openenv_env:OpenEnvEnvironment",
            kw.OpenEnvKwargs,
            "an OpenEnv environment server (kwargs.url, or kwargs.app started locally), played turn by turn",
            "openenv-core",
            "openenv",
            {"app": "telescope.envs.openenv_demo:app", "observation_field": "text"},
        ),
    ):  # agents: the gateway's client (openai) is needed too
        meta = _library_meta(name, module, pip_name, "openai")
        _add(
            register,
            name,
            factory,
            kwargs_model,
            description,
            **meta,
            multi_turn=True,
            example_kwargs=example,
        )
    _add(
        register,
        "i3_code",
        "i3_code:I3CodeEnvironment",
        kw.I3CodeKwargs,
        "INTELLECT-3 code tasks, tests run in a sandbox (kwargs.provider)",
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
        _add(register, name, f"evals:{cls}", kw.MathKwargs, f"{what} eval", **meta)
