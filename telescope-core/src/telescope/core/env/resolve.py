"""Building environments and evals from the registry under their canonical names."""

from __future__ import annotations

from typing import Any

from telescope.core.env.base import Environment
from telescope.core.registry import Registry

__all__ = ["create_environment", "create_eval"]


def create_environment(registry: Registry, name: str, kwargs: dict[str, Any] | None = None) -> Environment:
    """Validate ``kwargs`` and build environment ``name``; its ``name`` is the registry name."""
    env = registry.create("environment", name, kwargs)
    env.name = name
    return env  # type: ignore[no-any-return]


def create_eval(registry: Registry, name: str, kwargs: dict[str, Any] | None = None) -> Environment:
    """A dedicated eval by that name, else the environment of that name used as an eval."""
    kind = "eval" if registry.has("eval", name) or not registry.has("environment", name) else "environment"
    env = registry.create(kind, name, kwargs)
    env.name = name
    return env  # type: ignore[no-any-return]
