"""``telescope serve RUN.yaml|MODEL|CHECKPOINT [--port N] [--engine NAME]``: a model behind the OpenAI API."""

from __future__ import annotations

import asyncio
import os

import typer

from telescope.cli.errors import err_console, run_reporting_failures, say, user_errors
from telescope.cli.options import PLUGINS

__all__ = ["serve"]


@user_errors
def serve(
    ctx: typer.Context,
    target: str = typer.Argument(
        ..., help="A run config YAML, a Hugging Face model folder or hub name, or a native checkpoint folder."
    ),
    port: int = typer.Option(8000, "--port", help="Port of the OpenAI-compatible API."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (loopback by default; 0.0.0.0 exposes it)."
    ),
    engine: str = typer.Option(
        None,
        "--engine",
        help="Inference engine (transformers, vllm); default: the config's inference_engine.",
    ),
    tool_call_parser: str = typer.Option(
        None,
        "--tool_call_parser",
        "--tool-call-parser",
        help="How tool calls are read from the text: xml (<tool_call>) or python; default: the config's agent_tool_call_parser (xml).",
    ),
    served_model_name: str = typer.Option(
        None, "--served_model_name", "--served-model-name", help="Model id clients use."
    ),
    plugins: list[str] = PLUGINS,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Serve a model or a checkpoint on an OpenAI-compatible API (/v1/models, /v1/completions,
    /v1/chat/completions) until Ctrl-C, for agents, eval harnesses and scripts.

    Every request needs the run secret as its API key: TELESCOPE_RUN_SECRET if set, else a fresh one
    printed at start. Config fields can be overridden: --max_model_len 4096 --chat_template '...'.
    """
    from telescope.cli.context import strip_cli_flags
    from telescope.core.cluster.run_secret import ENV_VAR, ensure_run_secret
    from telescope.core.inference.gateway.standalone import ServeOptions, serve_config
    from telescope.core.inference.gateway.standalone import serve as run_serve
    from telescope.core.plugins import load_plugins

    if tool_call_parser not in (None, "xml", "python"):
        raise typer.BadParameter(f"--tool_call_parser {tool_call_parser!r}: use xml or python")
    given = bool(os.environ.get(ENV_VAR))
    secret = ensure_run_secret()
    _, registry = load_plugins(files=list(plugins))
    cfg = serve_config(target, strip_cli_flags(list(ctx.args)), registry, engine)
    options = ServeOptions(
        host=host,
        port=port,
        engine=engine,
        tool_call_parser=tool_call_parser,  # type: ignore[arg-type]
        served_model_name=served_model_name,
    )
    say(
        "telescope serve",
        f"{target}: model {cfg.model}, engine {cfg.inference_engine}; starting",
        style="bold",
    )

    def ready(url: str, log: str) -> None:
        say(
            "serving",
            f"{options.served_model_name or cfg.model} at {url} (engine log: {log})",
            style="bold green",
        )
        if given:
            say("api key:", f"the value of {ENV_VAR}", style="bold")
        else:
            say("api key:", f"{secret}  (set {ENV_VAR} to choose it)", style="bold")
        err_console.print(f"  openai.OpenAI(base_url={url!r}, api_key=<api key>); Ctrl-C stops")

    run_reporting_failures(
        lambda: asyncio.run(run_serve(cfg, registry, options, secret, on_ready=ready)),
        what="serve",
        interrupted="the engine and the gateway were stopped",
        logs="the engine log printed above",
        debug=debug,
    )
