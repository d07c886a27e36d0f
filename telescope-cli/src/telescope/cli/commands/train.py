"""``telescope train RUN.yaml [--field value ...]``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from telescope.cli.context import load_run
from telescope.cli.errors import run_reporting_failures, say, user_errors
from telescope.cli.options import PLUGINS, RUN_YAML
from telescope.core.cluster.netns import INSIDE_ENV
from telescope.core.config import TelescopeConfig


@user_errors
def train(
    ctx: typer.Context,
    run_yaml: Path = RUN_YAML,
    plugins: list[str] = PLUGINS,
    dry_run: bool = typer.Option(
        False,
        "--dry_run",
        "--dry-run",
        help="Check everything the run needs (env check, resources, ports, model); train nothing.",
    ),
) -> None:
    """Train: resolve the config, start the runtime and run the RL loop.

    Any config field can be overridden: --learning_rate 5e-7 --environments '[{name: countdown}]',
    into lists and dicts too: --environments.0.kwargs.seed 3. --debug is the config's debug field
    (tracebacks and DEBUG logs in every process, recorded in config.yaml).
    """
    from telescope.core.inference.auto import resolve_inference_engine, startup_summary

    run = load_run(run_yaml, list(ctx.args), plugins)
    cfg = run.cfg
    # --debug is an override of the config field, so config.yaml and every Ray worker get it too
    debug = cfg.debug
    if debug:
        from telescope.core.observe.debuglog import enable_debug_logging

        enable_debug_logging()
    engine, why = resolve_inference_engine(cfg.inference_engine)  # auto on a GPU without vLLM: refused here
    summary = startup_summary(cfg, engine, why)  # before the runtime exists (and for --dry-run)
    if os.environ.get(INSIDE_ENV) != "1":  # said once, by the command that started the namespace
        say("telescope train", f"{run_yaml}: {summary.line}", style="bold")
        for line in summary.notes:
            say("note:", line, style="bold yellow")
    if dry_run:
        _dry_run(run)
    code = _in_private_network(cfg)
    if code is not None:
        raise typer.Exit(code=code)
    code = run_reporting_failures(
        lambda: _train(run),
        what="training",
        interrupted="every server and trainer process was stopped",
        logs=f"{cfg.resolved_run_dir}/logs",
        debug=debug,
    )
    raise typer.Exit(code=code)


def _in_private_network(cfg: TelescopeConfig) -> int | None:
    """Run this command again inside the run's private network namespace (``cluster.netns``) and
    return its exit status; None: train in this process (and say why, when it matters)."""
    from telescope.cli import context
    from telescope.core.cluster import netns
    from telescope.core.cluster.addresses import is_loopback
    from telescope.core.runtime.cluster import starts_private_cluster

    if os.environ.get(netns.INSIDE_ENV) == "1":
        return None
    if context.program_command is None:  # called from Python: this process cannot be moved
        if cfg.ray_network_namespace == "required":
            raise netns.NetworkNamespaceError(
                "ray_network_namespace: required needs the `telescope train` program (a training "
                "started from Python stays in its process's namespace); run the command, or set auto"
            )
        return None
    private = starts_private_cluster(cfg)
    open_listeners = [] if is_loopback(cfg.inference_host) else [f"inference_host {cfg.inference_host}"]
    plan = netns.plan_namespace(
        cfg.ray_network_namespace, private_cluster=private, open_listeners=open_listeners
    )
    if not plan.use:
        if private and cfg.ray_network_namespace == "auto":
            say(
                "note:",
                f"no private network namespace ({plan.reason}): Ray's ports listen on every "
                "interface, token-protected (docs/security.md)",
                style="yellow",
            )
        return None
    say("network:", "private namespace for this run (nothing it listens on is reachable from outside it)")
    try:
        return netns.run_inside(context.program_command)
    except netns.NetworkNamespaceError as exc:
        if cfg.ray_network_namespace == "required":
            raise
        say("note:", f"no private network namespace ({exc}); training without it", style="yellow")
        return None


def _train(run: Any) -> int:
    """Import the runtime and train: a failed import (ray or torch missing or broken) is reported as
    ``training failed: <error>`` like any other failure, with its cause."""
    from telescope.core.runtime import run_training

    return int(run_training(run.cfg, run.pset, run.registry) or 0)


def _dry_run(run: Any) -> None:
    """Print one line per check of ``telescope.core.runtime.dryrun``; exit 0 when all pass, else 1."""
    import asyncio

    from telescope.cli.commands.env_check import print_check_lines
    from telescope.cli.errors import err_console
    from telescope.core.runtime.dryrun import dry_run

    failed = print_check_lines(asyncio.run(dry_run(run.cfg, run.registry)), width=22)
    err_console.print(
        f"dry run: {failed} problem(s); nothing was started" if failed else "dry run: ready to train"
    )
    raise typer.Exit(code=1 if failed else 0)
