"""Build the ``LoggerHub`` a run uses from the config and the registered logger plugins.

A logger component's registration metadata decides when it is on:
``enabled_by="<config field>"`` (on when that bool field is true, e.g. ``use_wandb``), or no
``enabled_by`` (always on: ``local``, ``console`` and third-party observers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telescope.core.observe.base import Logger
from telescope.core.observe.hub import LoggerHub

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.registry import Registry

__all__ = ["build_logger_hub", "enabled_logger_names"]


def enabled_logger_names(cfg: TelescopeConfig, registry: Registry) -> list[str]:
    """Names of the logger components this config turns on, ``local`` first."""
    names = []
    for comp in registry.components("logger"):
        field = comp.meta.get("enabled_by")
        if field is None or bool(getattr(cfg, field)):
            names.append(comp.name)
    if "local" not in names:
        raise RuntimeError(
            "no 'local' logger is registered: telescope-core's builtin loggers plugin is blocked"
        )
    return ["local"] + [n for n in names if n != "local"]


def build_logger_hub(
    cfg: TelescopeConfig, registry: Registry | None = None, *, exclude: tuple[str, ...] = ()
) -> LoggerHub:
    """Create every enabled logger (not yet started) and wrap them in a hub.

    Args:
        registry: a ``Registry``; None loads the installed plugins.
        exclude: logger names to leave out (e.g. ``("console",)`` for a quiet run).
    """
    if registry is None:
        from telescope.core.plugins import load_plugins

        _, registry = load_plugins()
    loggers: list[Logger] = []
    skipped: dict[str, str] = {}
    for name in enabled_logger_names(cfg, registry):
        comp = registry.get("logger", name)
        if name in exclude:
            continue
        if not comp.available and name != "local":
            skipped[name] = str(comp.unavailable)  # e.g. use_wandb without wandb: warn, run on
            continue
        logger = comp.create()
        logger.name = name
        loggers.append(logger)
    hub = LoggerHub(loggers)
    hub.skipped = skipped
    return hub
