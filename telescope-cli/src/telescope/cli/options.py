"""What the run commands (train, eval, config show/validate) take alike on their command lines."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["CONTEXT", "PLUGINS", "RUN_YAML"]

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
"""Click settings that leave ``--field value`` overrides in ``ctx.args``."""
RUN_YAML: Path = typer.Argument(..., help="Run config YAML.", dir_okay=False)
PLUGINS: list[str] = typer.Option(
    [], "--plugin", "-p", help="Load plugins from this Python file or module too (repeatable)."
)
