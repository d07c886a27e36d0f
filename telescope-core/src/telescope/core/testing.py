"""Helpers for tests of Telescope and of third-party plugins."""

from __future__ import annotations

from typing import Any

from telescope.core.config import TelescopeConfig
from telescope.core.plugins import PluginSet, build_registry, get_plugin_manager
from telescope.core.registry import PluginInfo, Registry

__all__ = ["make_config", "registry_with"]


def make_config(**overrides: Any) -> TelescopeConfig:
    """A schema-valid config with seed defaults, one environment, and ``overrides`` applied.

    Registry checks are not applied (use ``telescope.core.config.load_config`` for those).
    """
    overrides.setdefault("environments", [{"name": "reverse_text"}])
    return TelescopeConfig.model_validate(overrides)


def registry_with(*plugins: tuple[str, object], builtins: bool = True) -> tuple[PluginSet, Registry]:
    """A fresh registry from core built-ins (optional) plus in-test plugins ``(name, module_or_obj)``.

    Entry points are not loaded, so the result does not depend on what is installed.
    """
    pset = get_plugin_manager(load_entrypoints=False, block=() if builtins else _builtin_names())
    for name, plugin in plugins:
        pset.pm.register(plugin, name=name)
        pset.infos[name] = PluginInfo(name, getattr(plugin, "__name__", name), "tests", "0")
    return pset, build_registry(pset)


def _builtin_names() -> tuple[str, ...]:
    from telescope.core.plugins import BUILTIN_PLUGINS

    return tuple(name for name, _ in BUILTIN_PLUGINS)
