"""``telescope config show|validate``: the merged configuration and its sources."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from telescope.cli.context import load_run
from telescope.cli.errors import user_errors
from telescope.cli.options import CONTEXT, PLUGINS, RUN_YAML
from telescope.cli.style import new_app
from telescope.core.config import config_to_yaml
from telescope.core.config.secrets import redact_secrets

app = new_app(help="Show or validate a run configuration.", no_args_is_help=True)


@app.command("show", context_settings=CONTEXT)
@user_errors
def show(
    ctx: typer.Context,
    run_yaml: Path = RUN_YAML,
    sources: bool = typer.Option(False, "--sources", help="Show which layer set each value."),
) -> None:
    """Print the merged config (defaults -> RUN_YAML -> --field value overrides; --debug is the
    config's debug field, and shows tracebacks)."""
    run = load_run(run_yaml, list(ctx.args))
    if not sources:
        typer.echo(config_to_yaml(run.cfg), nl=False)
        return
    # YAML with the source of each value as a comment: still loadable, never truncated; secrets
    # redacted as in the plain output (a terminal's scrollback and a pasted issue are not private).
    for key, value in redact_secrets(run.cfg.to_dict()).items():
        line = yaml.safe_dump({key: value}, default_flow_style=True, width=10_000).strip()[1:-1]
        typer.echo(f"{line}  # {run.layers.sources.get(key, 'defaults')}")


@app.command("validate", context_settings=CONTEXT)
@user_errors
def validate(
    ctx: typer.Context,
    run_yaml: Path = RUN_YAML,
    plugins: list[str] = PLUGINS,
) -> None:
    """Validate a run config against the schema and the installed plugins."""
    run = load_run(run_yaml, list(ctx.args), plugins)
    envs = ", ".join(e.name for e in run.cfg.environments)
    typer.echo(
        f"{run_yaml}: valid (algorithm {run.cfg.algorithm}, backend {run.cfg.train_backend}, environments {envs})"
    )
