"""Loading plugins and a run config the same way in every command."""

from __future__ import annotations

from pathlib import Path

from telescope.core.config import Layers, TelescopeConfig, field_names, load_config_with_sources
from telescope.core.config.loader import resolve_layers
from telescope.core.plugins import PluginSet, load_plugins, local_plugin_name
from telescope.core.registry import Registry

__all__ = ["RunContext", "load_run", "program_command"]

program_command: list[str] | None = None
"""This process's command line when it runs as the ``telescope`` program (``app.main``), what
``telescope train`` runs again inside its private network namespace; None when the app is called from
Python (tests, notebooks), which then trains in its own process."""


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


def plugin_specs(path: Path | None, overrides: list[str], files: list[str]) -> list[str]:
    """The run's local plugins as absolute names: the config's ``plugins`` (paths relative to the
    config file) then ``files`` from the command line (relative to the working directory)."""
    raw = resolve_layers(path, overrides, field_names()).merged.get("plugins") or []
    base = path.resolve().parent if path is not None else None
    listed = [local_plugin_name(str(p), base) for p in raw] if isinstance(raw, list) else []
    return list(dict.fromkeys([*listed, *(local_plugin_name(f) for f in files)]))


def load_run(path: Path, overrides: list[str], plugin_files: list[str] | None = None) -> RunContext:
    """Load plugins (installed ones and the run's local ones), then merge and validate the run
    config against them; ``cfg.plugins`` holds the local plugins' absolute names."""
    specs = plugin_specs(path, overrides, list(plugin_files or []))
    pset, registry = load_plugins(files=specs)
    cfg, layers = load_config_with_sources(path, overrides, registry)
    if specs:
        cfg = cfg.model_copy(update={"plugins": specs})
    return RunContext(pset, registry, cfg, layers)
