"""Building environments and evals from the registry under their canonical names."""

from __future__ import annotations

from typing import Any

from telescope.core import faults
from telescope.core.env.base import Environment, EnvironmentKwargs
from telescope.core.registry import Component, Registry, did_you_mean

__all__ = ["create_environment", "create_eval", "environment_component_problems"]


def environment_component_problems(
    component: Component, kwargs: dict[str, Any], registry: Registry
) -> list[str]:
    """What config validation checks beyond the kwargs model itself (empty when fine).

    An environment's kwargs model must derive from ``EnvironmentKwargs`` (the host reads
    ``system_prompt`` and ``reward_timeout_s`` from it); validated kwargs then check what
    needs the registry (``EnvironmentKwargs.registry_problems``, e.g. a sandbox provider name).
    """
    model = component.kwargs_model
    if model is None:  # the environment class builds its own default kwargs
        return []
    if not issubclass(model, EnvironmentKwargs):
        got = f"{model.__module__}.{model.__qualname__}"
        return [
            f"{component.kind} '{component.name}' (plugin '{component.plugin.name}') registers {got}; an "
            "environment's kwargs model must subclass telescope.core.env.EnvironmentKwargs (or "
            "SingleTurnKwargs / MultiTurnKwargs), which carries system_prompt and reward_timeout_s: "
            f"write `class {model.__name__}(SingleTurnKwargs): ...`"
        ]
    factory = _factory_problem(component)
    if factory is not None:
        return [factory]
    validated = model.model_validate(dict(kwargs))
    return list(validated.registry_problems(registry))


def _factory_problem(component: Component) -> str | None:
    """Why the registered ``module:attribute`` factory does not import (with a did-you-mean)."""
    if callable(component.factory):
        return None
    module_name, _, attr = component.factory.partition(":")
    try:
        component.load_factory()
    except ModuleNotFoundError as exc:
        return (
            f"{component.kind} '{component.name}' (plugin '{component.plugin.name}'): factory "
            f"'{component.factory}' cannot be imported: {exc}"
        )
    except AttributeError:
        import importlib

        names = [n for n in dir(importlib.import_module(module_name)) if not n.startswith("_")]
        return (
            f"{component.kind} '{component.name}' (plugin '{component.plugin.name}'): factory "
            f"'{component.factory}': module '{module_name}' has no '{attr}'.{did_you_mean(attr, names)}"
        )
    except Exception as exc:  # noqa: BLE001 - the plugin's module itself is broken
        return (
            f"{component.kind} '{component.name}' (plugin '{component.plugin.name}'): importing factory "
            f"'{component.factory}' failed: {type(exc).__name__}: {exc}"
        )
    return None


def create_environment(registry: Registry, name: str, kwargs: dict[str, Any] | None = None) -> Environment:
    """Validate ``kwargs`` and build environment ``name``; its ``name`` is the registry name."""
    return _create(registry, "environment", name, kwargs)


def create_eval(registry: Registry, name: str, kwargs: dict[str, Any] | None = None) -> Environment:
    """A dedicated eval by that name, else the environment of that name used as an eval."""
    kind = "eval" if registry.has("eval", name) or not registry.has("environment", name) else "environment"
    return _create(registry, kind, name, kwargs)


def _create(registry: Registry, kind: str, name: str, kwargs: dict[str, Any] | None) -> Environment:
    problems = environment_component_problems(registry.get(kind, name), kwargs or {}, registry)
    if problems:
        raise ValueError("; ".join(problems))
    env: Environment = registry.create(kind, name, kwargs)
    env.name = name
    if faults.current() is not None:  # TELESCOPE_FAULTS: rewards may raise or hang (env/faults.py)
        from telescope.core.env.faults import inject_reward_faults

        inject_reward_faults(env)
    return env
