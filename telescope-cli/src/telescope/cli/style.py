"""The conventions every ``telescope`` command shares: ``-h``/``--help``, and on/off flags shown
without a value placeholder (typer prints ``<bool>`` after a flag, which reads as if it took one)."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

__all__ = ["CONTEXT_SETTINGS", "TelescopeGroup", "new_app"]

#: Inherited by every subcommand's context (click copies help_option_names from the parent).
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def _bare_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_bool_flag", False) and not getattr(param, "secondary_opts", None):
            param.metavar = ""  # rendered as the (empty) type column
    return params


class TelescopeGroup(TyperGroup):
    """A command group whose own options and whose commands' options show flags bare."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not isinstance(cmd, TyperGroup):
            _bare_flags(cmd.get_params(ctx))  # subgroups are TelescopeGroups and do this themselves
        return cmd


def new_app(**kwargs: Any) -> typer.Typer:
    """A ``typer.Typer`` with the shared conventions (every command group is made with this)."""
    return typer.Typer(cls=TelescopeGroup, context_settings=dict(CONTEXT_SETTINGS), **kwargs)
