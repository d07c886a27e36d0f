"""Loading plugins and a run config the same way in every command."""

from __future__ import annotations

from pathlib import Path

from telescope.core.config import Layers, TelescopeConfig, load_config_with_sources
from telescope.core.plugins import PluginSet, load_plugins
from telescope.core.registry import Registry

__all__ = ["RunContext", "load_run"]


class RunContext:
    """Resolved plugins and config for one command invocation."""

    def __init__(self, pset: PluginSet, registry: Registry, cfg: TelescopeConfig, layers: Layers) -> None:
        self.pset = pset
        self.registry = registry
        self.cfg = cfg
        self.layers = layers


def strip_cli_flags(args: list[str], flags: tuple[str, ...] = ("--debug",)) -> list[str]:
    """Overrides without the CLI's own flags (click leaves them in the extra args)."""
    return [a for a in args if a not in flags]


def load_run(path: Path, overrides: list[str]) -> RunContext:
    """Load plugins, then merge and validate the run config against them."""
    pset, registry = load_plugins()
    cfg, layers = load_config_with_sources(path, strip_cli_flags(overrides), registry)
    return RunContext(pset, registry, cfg, layers)
