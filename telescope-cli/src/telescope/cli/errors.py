"""User-facing error handling: one clear message and exit code 2, a traceback only with --debug."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from telescope.core.config import ConfigError
from telescope.core.plugins import PluginLoadError
from telescope.core.registry import DuplicateComponentError, UnavailableComponentError, UnknownComponentError

__all__ = ["USER_ERRORS", "err_console", "escape", "run_reporting_failures", "say", "user_errors"]

#: Exceptions that mean "the user can fix this": printed plainly, exit code 2.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    PluginLoadError,
    DuplicateComponentError,
    UnknownComponentError,
    UnavailableComponentError,
)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])


def say(label: str, text: object, *, style: str = "bold red", console: Console | None = None) -> None:
    """Print ``label`` in ``style``, then ``text`` verbatim.

    Messages are never parsed as rich markup: "pip install 'telescope-core[vllm]'" keeps its
    "[vllm]" (markup would swallow it). Every user-facing message goes through here or ``escape``.
    """
    (console or err_console).print(Text.assemble((label, style), " ", str(text)))


def debug_enabled(flag: object = False, overrides: list[str] | None = None) -> bool:
    """True when the command's --debug flag is set, the overrides set the ``debug`` field
    (commands that read a run config take ``--debug`` as that field), or TELESCOPE_DEBUG=1."""
    return bool(flag) or debug_override(overrides or []) or os.environ.get("TELESCOPE_DEBUG") == "1"


def debug_override(args: list[str]) -> bool:
    """Whether ``--debug`` / ``--debug VALUE`` / ``--debug=VALUE`` in ``args`` sets ``debug`` true,
    read before the config is (its errors should show a traceback too)."""
    from telescope.core.config.loader import parse_yaml_value

    value: object = False
    for i, arg in enumerate(args):
        if arg == "--debug":
            nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "true"
            value = _yaml_or_none(parse_yaml_value, nxt)
        elif arg.startswith("--debug="):
            value = _yaml_or_none(parse_yaml_value, arg.partition("=")[2])
    return value is True


def _yaml_or_none(parse: Callable[[str], Any], text: str) -> Any:
    import yaml

    try:
        return parse(text)
    except yaml.YAMLError:  # the config loader reports it, naming the field
        return None


def user_errors(func: F) -> F:
    """Turn user errors raised by a command into a message and exit code 2."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as exc:
            ctx = kwargs.get("ctx")
            debug = debug_enabled(kwargs.get("debug"), list(getattr(ctx, "args", None) or []))
            if debug:
                err_console.print_exception()
            say("error:", exc)
            if not debug:
                err_console.print("[dim](run with --debug for the traceback)[/]")
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def run_reporting_failures(
    work: Callable[[], Any], *, what: str, interrupted: str, logs: str, debug: bool
) -> Any:
    """Run a long command's work: Ctrl-C exits 130, a runtime failure prints its root cause and exits 1.

    User errors propagate (``user_errors`` turns them into exit code 2).
    """
    try:
        return work()
    except KeyboardInterrupt:
        say("interrupted:", interrupted, style="bold yellow")
        raise typer.Exit(code=130) from None
    except USER_ERRORS:
        raise
    except Exception as exc:
        if debug:
            raise
        from telescope.core.errors import describe_failure, failure_log_tail

        say(f"{what} failed:", describe_failure(exc))
        for line in failure_log_tail(exc):  # e.g. the server's traceback that ends in the cause
            err_console.print(Text(f"  | {line}", style="dim"))
        say("logs:", f"{logs} — run with --debug for the full traceback", style="dim")
        raise typer.Exit(code=1) from None
