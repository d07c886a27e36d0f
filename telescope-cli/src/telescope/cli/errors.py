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


def debug_enabled(flag: object = False) -> bool:
    """True when the command's --debug flag is set (or TELESCOPE_DEBUG=1)."""
    return bool(flag) or os.environ.get("TELESCOPE_DEBUG") == "1"


def user_errors(func: F) -> F:
    """Turn user errors raised by a command into a message and exit code 2."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as exc:
            debug = debug_enabled(kwargs.get("debug"))
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
        from telescope.core.runtime.errors import describe_failure

        say(f"{what} failed:", describe_failure(exc))
        say("logs:", f"{logs} — run with --debug for the full traceback", style="dim")
        raise typer.Exit(code=1) from None
