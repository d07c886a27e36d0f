"""``telescope env check NAME [--kwargs YAML]``: try an environment without training."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.markup import escape

from telescope.cli.context import load_run
from telescope.cli.errors import err_console, user_errors

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["check", "print_check_lines"]


def print_check_lines(lines: list[Any], width: int) -> int:
    """``ok``/``FAIL``, the step and its message, one line each; returns how many failed."""
    for line in lines:
        mark = "[green]ok  [/]" if line.ok else "[bold red]FAIL[/]"
        err_console.print(f"{mark} {line.step:<{width}} {escape(line.message)}", markup=True, highlight=False)
    return sum(not line.ok for line in lines)


def _kwargs(text: str | None, cfg: TelescopeConfig | None, name: str, as_eval: bool) -> dict[str, Any]:
    """``--kwargs`` (a YAML/JSON mapping), else the run config's entry for ``name``, else {}."""
    if text is not None:
        value = yaml.safe_load(text)
        if not isinstance(value, dict):
            raise typer.BadParameter(f"--kwargs must be a mapping like '{{num_samples: 3}}', got {text!r}")
        return value
    entries = [*(cfg.evals if as_eval else []), *cfg.environments] if cfg is not None else []
    return next((dict(e.kwargs) for e in entries if e.name == name), {})


def _tokenizer(model: str, chat_template: str | None) -> Any:
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


@user_errors
def _agent_rollout(model: str) -> Any:
    """Runs an agent environment's rollout against ``model`` served in this process."""

    async def run(env: Any, sample: Any) -> Any:
        from telescope.core.rollouts.agent_check import try_agent

        return await try_agent(env, sample, model)

    return run


def check(
    name: str = typer.Argument(..., help="Environment or eval name (see: telescope envs list)."),
    kwargs: str | None = typer.Option(
        None, "--kwargs", help="Environment kwargs as YAML: '{num_samples: 3}'."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Run config: its model, chat template and this environment's kwargs."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Tokenizer to render prompts with (default: the config's, else telescope/tiny)."
    ),
    samples: int = typer.Option(3, "--samples", min=1, help="Samples to load and render."),
    as_eval: bool = typer.Option(False, "--eval", help="Check NAME as an eval (evals: section)."),
    plugins: list[str] = typer.Option(
        [], "--plugin", "-p", help="Also load plugins from this Python file or module (repeatable)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Build NAME, load samples, render prompts, probe its resources, score a reference and a junk answer.

    Prints one line per step; exits 1 when any step fails.
    """
    from telescope.core.env.chat import ChatOptions
    from telescope.core.env.check import check_environment
    from telescope.core.plugins import load_plugins, local_plugin_name

    if config is not None:
        run = load_run(config, [], plugins)
        cfg, registry = run.cfg, run.registry
    else:
        cfg, registry = None, load_plugins(files=[local_plugin_name(p) for p in plugins])[1]
    as_eval = as_eval or (not registry.has("environment", name) and registry.has("eval", name))
    tokenizer = _tokenizer(
        model or (cfg.model if cfg is not None else "telescope/tiny"),
        cfg.chat_template if cfg is not None else None,
    )
    chat = ChatOptions.from_config(cfg) if cfg is not None else None
    lines = asyncio.run(
        check_environment(
            registry,
            name,
            _kwargs(kwargs, cfg, name, as_eval),
            tokenizer=tokenizer,
            chat=chat,
            num_samples=samples,
            as_eval=as_eval,
            agent_rollout=_agent_rollout(model or (cfg.model if cfg is not None else "telescope/tiny")),
        )
    )
    failed = print_check_lines(lines, width=9)
    if failed:
        err_console.print(f"[bold red]{name}: {failed} check(s) failed[/]")
        raise typer.Exit(code=1)
    err_console.print(f"[green]{name}: every check passed[/]")
