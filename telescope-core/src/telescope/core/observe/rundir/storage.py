"""Writes to the run directory that failed: named by path and cause, fatal to the run.

A run that cannot record what it trains, or cannot checkpoint, must stop and say so: a
full disk found hours later (an empty ``checkpoints/``, metrics that stop mid-run) costs
the whole run. ``describe_os_error`` turns the errno into words a user acts on.
"""

from __future__ import annotations

import errno

__all__ = ["StorageError", "describe_os_error", "find_os_error"]

_CAUSES = {
    errno.ENOSPC: "disk full (ENOSPC)",
    errno.EDQUOT: "disk quota exceeded (EDQUOT)",
    errno.EROFS: "read-only file system (EROFS)",
    errno.EACCES: "permission denied (EACCES)",
    errno.EIO: "input/output error (EIO)",
    errno.ENOENT: "the folder disappeared (ENOENT)",
}


class StorageError(RuntimeError):
    """A file of the run directory (records, checkpoint) could not be written; the run stops."""

    complete_reason = True  # names the file and the cause: failure reports show it, not what it wraps


def find_os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc``: itself, a Ray task error's cause, or a ``raise ... from`` chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        inner = getattr(current, "cause", None)  # ray.exceptions.RayTaskError
        current = inner if isinstance(inner, BaseException) else current.__cause__ or current.__context__
    return None


def describe_os_error(exc: BaseException) -> str:
    """``disk full (ENOSPC)`` and the like for a known errno, else ``Type: message``."""
    os_error = find_os_error(exc)
    if os_error is not None and os_error.errno in _CAUSES:
        return _CAUSES[os_error.errno]
    target = os_error or exc
    return f"{type(target).__name__}: {target}"
