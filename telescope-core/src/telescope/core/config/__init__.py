"""Run configuration: schema, three-layer loading, and validation against installed plugins.

``load_config("run.yaml", ["--learning_rate", "5e-7"])`` returns a frozen ``TelescopeConfig``
or raises ``ConfigError`` whose ``problems`` name each bad field, its value and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from telescope.core.config.entries import EnvironmentEntry, EvalEntry
from telescope.core.config.errors import ConfigError, problems_from_validation_error
from telescope.core.config.loader import CLI_SOURCE, DEFAULTS_SOURCE, Layers, resolve_layers
from telescope.core.config.schema import TelescopeConfig
from telescope.core.config.validate import default_advantage_norm, registry_problems
from telescope.core.registry import Registry

__all__ = [
    "CLI_SOURCE",
    "DEFAULTS_SOURCE",
    "ConfigError",
    "EnvironmentEntry",
    "EvalEntry",
    "Layers",
    "TelescopeConfig",
    "config_to_yaml",
    "field_names",
    "load_config",
    "load_config_with_sources",
    "validate_config",
]


def field_names() -> list[str]:
    """Every top-level config field name."""
    return list(TelescopeConfig.model_fields)


def validate_config(
    raw: dict[str, Any], registry: Registry | None, *, source: str | None = None
) -> TelescopeConfig:
    """Validate a merged raw mapping: schema first, then (with a registry) installed plugins."""
    try:
        cfg = TelescopeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            problems_from_validation_error(exc, known_fields=field_names()), source=source
        ) from None
    if registry is not None:
        problems = registry_problems(cfg, registry)
        if problems:
            raise ConfigError(problems, source=source)
    return cfg


def load_config_with_sources(
    path: str | Path | None,
    overrides: list[str] | dict[str, Any] | None = None,
    registry: Registry | None = None,
) -> tuple[TelescopeConfig, Layers]:
    """Load, merge and validate; also return which layer set each key."""
    layers = resolve_layers(path, overrides, field_names())
    if registry is not None and "advantage_norm" not in layers.user_keys:
        preferred = default_advantage_norm(layers.merged, registry)
        if preferred is not None:
            layers.merged["advantage_norm"] = preferred
            layers.sources["advantage_norm"] = f"algorithm {layers.merged.get('algorithm')}"
    cfg = validate_config(layers.merged, registry, source=str(path) if path else None)
    return cfg, layers


def load_config(
    path: str | Path | None,
    overrides: list[str] | dict[str, Any] | None = None,
    registry: Registry | None = None,
) -> TelescopeConfig:
    """Load, merge and validate a run config (see module docstring)."""
    return load_config_with_sources(path, overrides, registry)[0]


def config_to_yaml(cfg: TelescopeConfig) -> str:
    """The resolved config as YAML, in schema order, secrets redacted (``config.secrets``)."""
    from telescope.core.config.secrets import redact_secrets

    return yaml.safe_dump(redact_secrets(cfg.to_dict()), sort_keys=False, default_flow_style=False)
