"""``telescope eval EVAL.yaml [--field value ...]``: evaluate checkpoints with the training eval definitions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer

from telescope.cli.errors import err_console, run_reporting_failures, say, user_errors

__all__ = ["eval_command"]


def _summary(ref: Any, results: list[Any]) -> None:
    from telescope.core.observe.loggers.console import format_eval

    for r in results:
        err_console.print(
            format_eval(ref.step, r.name, r.metrics, len(r.rows)), style="bold cyan", markup=False
        )


@user_errors
def eval_command(
    ctx: typer.Context,
    eval_yaml: Path = typer.Argument(
        ..., help="Eval config YAML (see examples/eval/eval.yaml).", dir_okay=False
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Evaluate checkpoints (native or Hugging Face) and write <run_dir>/evals/metrics.jsonl.

    Any field can be overridden: --checkpoint_dir runs/x/checkpoints --inference_num_workers 2.
    """
    from rich.progress import Progress

    from telescope.cli.context import strip_cli_flags
    from telescope.core.config.loader import parse_overrides
    from telescope.core.evals.standalone import discover_checkpoints, evaluate_checkpoints
    from telescope.core.evals.standalone_config import EvalRunConfig, check_eval_names, load_eval_run_config
    from telescope.core.plugins import load_plugins

    overrides = parse_overrides(strip_cli_flags(list(ctx.args)), list(EvalRunConfig.model_fields))
    run = load_eval_run_config(eval_yaml, overrides)
    _, registry = load_plugins()
    check_eval_names(run, registry)
    refs = discover_checkpoints(run)
    say(
        "telescope eval",
        f"{eval_yaml}: {len(refs)} checkpoint(s) (steps {', '.join(str(r.step) for r in refs)}), "
        f"evals {', '.join(e.name for e in run.evals)}, results in {run.resolved_run_dir / 'evals'}",
        style="bold",
    )
    with Progress(console=err_console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"eval {name}", total=total)
            bar.update(tasks[name], completed=done, total=total)
            if done >= total:
                tasks.pop(name)  # the next checkpoint starts a fresh bar

        run_reporting_failures(
            lambda: asyncio.run(
                evaluate_checkpoints(run, registry, progress=progress, on_checkpoint=_summary)
            ),
            what="eval",
            interrupted="the eval servers were stopped",
            logs=f"{run.resolved_run_dir}/logs/eval_inference",
            debug=debug,
        )
