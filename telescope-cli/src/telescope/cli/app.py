"""The ``telescope`` command: one Typer app, one module per command group."""

from __future__ import annotations

import sys

import typer

from telescope.cli.commands import checkpoint as checkpoint_cmd
from telescope.cli.commands import config as config_cmd
from telescope.cli.commands import eval as eval_cmd
from telescope.cli.commands import plugins as plugins_cmd
from telescope.cli.commands import serve as serve_cmd
from telescope.cli.commands import train as train_cmd
from telescope.cli.commands import ui as ui_cmd
from telescope.cli.options import CONTEXT
from telescope.cli.style import new_app

__all__ = ["app", "main"]

app = new_app(
    name="telescope",
    help="Post-train LLMs with reinforcement learning. Start with: telescope train RUN.yaml",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        names = [
            "telescope-core",
            "telescope-cli",
            "telescope-fsdp",
            "telescope-megatron",
            "telescope-envs",
            "telescope-sandboxes",
        ]
        for name in names:
            try:
                typer.echo(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                continue
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show versions and exit."
    ),
) -> None:
    """Telescope: RL post-training for reasoning and agents."""


app.command("train", context_settings=CONTEXT)(train_cmd.train)
app.command("eval", context_settings=CONTEXT)(eval_cmd.eval_command)
app.command("serve", context_settings=CONTEXT)(serve_cmd.serve)
app.command("ui")(ui_cmd.ui)
app.add_typer(config_cmd.app, name="config")
app.add_typer(plugins_cmd.app, name="plugins")
app.add_typer(checkpoint_cmd.app, name="checkpoint")


def _add_optional_commands() -> None:
    """Commands that live in other modules of this package and may not exist yet."""
    try:
        from telescope.cli.commands import envs as envs_cmd
    except ImportError:
        return
    sub = getattr(envs_cmd, "app", None)
    if sub is not None:
        app.add_typer(sub, name="envs")
        app.add_typer(sub, name="env", hidden=True)  # `telescope env check NAME` reads naturally
    from telescope.cli.commands import runs as runs_cmd

    app.add_typer(runs_cmd.app, name="runs")


_add_optional_commands()


def main() -> None:
    """Console-script entry point."""
    from telescope.cli import context

    context.program_command = [sys.executable, *sys.orig_argv[1:]]
    app()
