"""``telescope ui [RUN_DIR_OR_PARENT ...]``: the dashboard over run directories, live."""

from __future__ import annotations

import threading
import webbrowser
from pathlib import Path

import typer

from telescope.cli.errors import err_console
from telescope.core.cluster.addresses import is_loopback

__all__ = ["ui"]


def _default_paths() -> list[Path]:
    runs = Path("runs")
    return [runs if runs.is_dir() else Path(".")]


#: How often ``--wandb`` downloads again what changed (live runs keep uploading).
WANDB_REPULL_S = 30.0


def _pull_wandb(target: str) -> Path:
    """Pull now (errors end the command), then again every ``WANDB_REPULL_S`` in the background."""
    from telescope.cli.ui.wandb_pull import pull_runs

    try:
        folder = pull_runs(target)
    except (ImportError, ValueError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None

    def again() -> None:
        while True:
            threading.Event().wait(WANDB_REPULL_S)
            try:
                pull_runs(target)
            except Exception as exc:  # noqa: BLE001 - a network hiccup must not stop the dashboard
                err_console.print(f"[yellow]warning:[/] re-pulling {target} from W&B failed: {exc}")

    threading.Thread(target=again, name="wandb-repull", daemon=True).start()
    typer.echo(f"telescope ui: W&B {target} cached in {folder}")
    return folder


def ui(
    paths: list[Path] = typer.Argument(None, help="Run directories, or folders of runs (default: ./runs)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (no auth: keep it local)."),
    port: int = typer.Option(8005, "--port", help="Port to listen on."),
    no_browser: bool = typer.Option(False, "--no_browser", "--no-browser", help="Do not open a browser tab."),
    wandb: str = typer.Option(
        "",
        "--wandb",
        help="ENTITY/PROJECT or ENTITY/PROJECT/RUN: pull W&B runs into a local cache and show them.",
    ),
) -> None:
    """Serve the dashboard (Runs, Metrics, Rollouts, Timeline, Infra, Evals, Logs), updated live."""
    try:
        from aiohttp import web

        from telescope.cli.ui.data import Workspace
        from telescope.cli.ui.server import build_app, plotly_js_path
    except ImportError as exc:
        err_console.print(
            f"[bold red]error:[/] telescope ui needs the ui extra ({exc}): pip install 'telescope-cli[ui]'"
        )
        raise typer.Exit(code=2) from None
    from telescope.core.observe.rundir.reader import RunDirError

    targets = list(paths or [])
    if wandb:
        targets.append(_pull_wandb(wandb))
    try:
        workspace = Workspace(targets or _default_paths())
    except RunDirError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    if not is_loopback(host):
        err_console.print(
            f"[bold yellow]warning:[/] binding {host}: the dashboard has no authentication, anyone who can "
            "reach this address can read these runs"
        )
    if plotly_js_path() is None:
        err_console.print(
            "[yellow]warning:[/] plotly is not installed, charts will not draw: pip install 'telescope-cli[ui]'"
        )
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
    typer.echo(f"telescope ui: {len(workspace.runs())} run(s) at {url} (Ctrl-C to stop)")
    if not no_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    try:
        web.run_app(build_app(workspace), host=host, port=port, print=None, access_log=None)
    except OSError as exc:
        err_console.print(f"[bold red]error:[/] cannot listen on {host}:{port} ({exc}): pick another --port")
        raise typer.Exit(code=2) from None
