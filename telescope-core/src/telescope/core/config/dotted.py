"""Dotted CLI overrides: ``--environments.0.kwargs.seed 3`` sets one value inside a list or dict
field instead of replacing the whole field."""

from __future__ import annotations

import copy
from typing import Any

from telescope.core.config.errors import ConfigError

__all__ = ["apply_overrides", "split_override_key"]


def split_override_key(key: str) -> tuple[str, list[str]]:
    """``"environments.0.kwargs.seed"`` -> ``("environments", ["0", "kwargs", "seed"])``.

    Only the field name has its dashes turned into underscores: dict keys are kept as written.
    """
    field, *path = key.split(".")
    if any(not part for part in path):
        raise ConfigError(f"override --{key}: empty part in the dotted path (write --field.key.0 value)")
    return field.replace("-", "_"), path


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied in order: a plain key replaces the field, a dotted key
    sets one nested value (list items by index, dict keys created when missing). ``base`` is
    not modified."""
    out = dict(base)
    for key, value in overrides.items():
        field, path = split_override_key(key)
        if not path:
            out[field] = value
            continue
        out[field] = _set_in(copy.deepcopy(out.get(field)), field, path, value, key)
    return out


def _set_in(container: Any, prefix: str, path: list[str], value: Any, key: str) -> Any:
    """``container`` with ``value`` at ``path`` (``prefix`` names ``container`` in errors)."""
    part, rest = path[0], path[1:]
    if container is None:
        container = {}  # an unset dict field (``null``) or a missing key: a dict is made
    if isinstance(container, dict):
        container[part] = (
            _set_in(container.get(part), f"{prefix}.{part}", rest, value, key) if rest else value
        )
        return container
    if isinstance(container, list):
        if not part.isdigit():
            raise ConfigError(
                f"override --{key}: {prefix} is a list, so '{part}' must be an index (0, 1, ...)"
            )
        index = int(part)
        if index >= len(container):
            raise ConfigError(
                f"override --{key}: index {index} is out of range: {prefix} has {len(container)} item(s) "
                f"(set the whole list with --{prefix} '[...]' to add items)"
            )
        container[index] = _set_in(container[index], f"{prefix}.{part}", rest, value, key) if rest else value
        return container
    raise ConfigError(
        f"override --{key}: {prefix} is {container!r} ({type(container).__name__}), not a dict or list, "
        f"so it has no '{part}'"
    )
