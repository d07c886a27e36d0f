"""Turning a failed run's exception chain into the one line a user needs."""

from __future__ import annotations

__all__ = ["describe_failure", "failure_log_tail", "root_cause"]


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
