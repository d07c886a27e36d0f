"""Turning a failed run's exception chain into the one line a user needs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

__all__ = [
    "RunStageError",
    "describe_failure",
    "exception_chain",
    "failure_log_tail",
    "root_cause",
    "stage_error",
]

log = logging.getLogger("telescope.orchestrator")

_FIXES = {
    "train_step": "the trainer's traceback is in <run_dir>/logs/telescope.log",
    "weight sync": "an inference server may have died or stopped answering: see <run_dir>/logs/inference",
    "prompt preparation": "check the environment's kwargs and dataset (the traceback is in "
    "<run_dir>/logs/telescope.log); --enable_prompt_prefetch false prepares prompts inline",
}


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps, outermost first: the original exception a Ray task error keeps
    (``cause``), else ``__cause__`` (``raise ... from``), else ``__context__`` (the exception being
    handled, even behind ``from None``: ``stage_error``'s are raised so and still come from there)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        inner = getattr(current, "cause", None)
        if isinstance(inner, BaseException):
            current = inner
        else:
            current = current.__cause__ or current.__context__


def root_cause(exc: BaseException) -> BaseException:
    """The innermost meaningful exception: unwraps Ray task errors and ``raise ... from`` chains.

    An exception whose class sets ``complete_reason = True`` is kept: its message already says
    what failed and why (``StorageError``: the file and ``disk full (ENOSPC)``; a dead trainer rank).
    """
    seen: set[int] = set()
    while id(exc) not in seen and not getattr(exc, "complete_reason", False):
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the original here
        if isinstance(inner, BaseException):
            exc = inner
            continue
        if exc.__cause__ is not None:
            exc = exc.__cause__
            continue
        break
    return exc


def describe_failure(exc: BaseException) -> str:
    """``Type: message`` of the root cause, first line only (Ray appends remote tracebacks)."""
    cause = root_cause(exc)
    message = str(cause).strip().splitlines()
    first = message[0] if message else ""
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


def failure_log_tail(exc: BaseException, lines: int = 12) -> list[str]:
    """The last log lines the root cause carries (``log_tail``: a server that failed to start), or []."""
    tail = getattr(root_cause(exc), "log_tail", None)
    if not isinstance(tail, list | tuple):
        return []
    return [str(line) for line in tail][-lines:]


class RunStageError(RuntimeError):
    """A part of the run failed; the message says which, at which step, and the fix when known."""


def stage_error(stage: str, exc: BaseException, step: int | None = None) -> BaseException:
    """``RunStageError`` for ``exc`` raised in ``stage``; logs the full traceback (file logs only).

    The original exception is not chained (``describe_failure`` would unwrap down to it and
    drop the stage); its one-line description is part of the message instead.
    """
    from telescope.core.config import ConfigError

    if isinstance(exc, (RunStageError, ConfigError)):
        return exc  # already says where; a config error keeps its own type (exit code 2)
    where = f"step {step}: {stage}" if step is not None else stage
    log.info("%s failed", where, exc_info=exc)  # the traceback, for telescope.log (INFO, not the console)
    fix = next((f"; {fix}" for key, fix in _FIXES.items() if stage.startswith(key)), "")
    error = RunStageError(f"{where} failed: {describe_failure(exc)}{fix}")
    error.original = exc  # type: ignore[attr-defined]
    return error
