"""``telescope train RUN.yaml [--field value ...]``."""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

from telescope.cli.context import load_run
from telescope.cli.errors import USER_ERRORS, err_console, user_errors

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@user_errors
def train(
    ctx: typer.Context,
    run_yaml: Path = typer.Argument(..., help="Run config YAML.", dir_okay=False),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Train: resolve the config, start the runtime and run the RL loop.

    Any config field can be overridden: --learning_rate 5e-7 --environments '[{name: countdown}]'.
    """
    run = load_run(run_yaml, list(ctx.args))
    cfg = run.cfg
    err_console.print(
        f"[bold]telescope train[/] {run_yaml}: model {cfg.model}, algorithm {cfg.algorithm}, backend "
        f"{cfg.train_backend}, engine {cfg.inference_engine}, {cfg.inference_num_workers} inference + "
        f"{cfg.trainer_num_workers} trainer workers, {cfg.number_of_steps} steps, run dir {cfg.resolved_run_dir}"
    )
    try:
        runtime = importlib.import_module("telescope.core.runtime")
    except ModuleNotFoundError:
        err_console.print(
            "[bold red]error:[/] the training runtime (orchestrator on Ray) is not part of this release yet; "
            "the config above is valid but no training was run."
        )
        raise typer.Exit(code=1) from None
    try:
        code = int(runtime.run_training(run.cfg, run.pset, run.registry) or 0)
    except KeyboardInterrupt:
        err_console.print("[bold yellow]interrupted:[/] every server and trainer process was stopped")
        raise typer.Exit(code=130) from None
    except USER_ERRORS:
        raise
    except Exception as exc:
        if debug:
            raise
        from telescope.core.runtime.errors import describe_failure

        err_console.print(f"[bold red]training failed:[/] {describe_failure(exc)}", markup=True)
        err_console.print(
            f"[dim]logs: {cfg.resolved_run_dir}/logs — run with --debug for the full traceback[/]"
        )
        raise typer.Exit(code=1) from None
    raise typer.Exit(code=code)
