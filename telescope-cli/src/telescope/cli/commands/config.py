"""``telescope config show|validate``: the merged configuration and its sources."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from telescope.cli.context import load_run
from telescope.cli.errors import user_errors
from telescope.core.config import config_to_yaml

app = typer.Typer(help="Show or validate a run configuration.", no_args_is_help=True)
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("show", context_settings=CONTEXT)
@user_errors
def show(
    ctx: typer.Context,
    run_yaml: Path = typer.Argument(..., help="Run config YAML.", dir_okay=False),
    sources: bool = typer.Option(False, "--sources", help="Show which layer set each value."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Print the merged config (defaults -> RUN_YAML -> --field value overrides)."""
    run = load_run(run_yaml, list(ctx.args))
    if not sources:
        typer.echo(config_to_yaml(run.cfg), nl=False)
        return
    table = Table("field", "value", "set by", box=None, pad_edge=False)
    for key, value in run.cfg.to_dict().items():
        shown = (
            yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
        )
        table.add_row(key, shown, run.layers.sources.get(key, "defaults"))
    Console(soft_wrap=True).print(table)


@app.command("validate", context_settings=CONTEXT)
@user_errors
def validate(
    ctx: typer.Context,
    run_yaml: Path = typer.Argument(..., help="Run config YAML.", dir_okay=False),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Validate a run config against the schema and the installed plugins."""
    run = load_run(run_yaml, list(ctx.args))
    envs = ", ".join(e.name for e in run.cfg.environments)
    typer.echo(
        f"{run_yaml}: valid (algorithm {run.cfg.algorithm}, backend {run.cfg.train_backend}, environments {envs})"
    )
