"""Turning a failed run's exception chain into the one line a user needs."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["describe_failure", "exception_chain", "failure_log_tail", "root_cause"]


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
