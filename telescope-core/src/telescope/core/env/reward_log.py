"""Reward failures are loud: the first failure of each reward function per environment is logged.

``Environment.score`` marks the environment being scored (a context variable, so a ``Rubric``
running inside it knows whose function failed); every failure after the first one of a
function is only counted (``reward_error`` / ``reward_timeout`` in the sample metrics, and the
``reward/<env>/errors`` step metric).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

__all__ = ["report", "scoring"]

log = logging.getLogger("telescope.env")

_SCORING: ContextVar[Any] = ContextVar("telescope_scoring_env", default=None)


def scoring(env: Any) -> Any:
    """Mark ``env`` as the environment being scored in this context; returns the reset token."""
    return _SCORING.set(env)


def reset(token: Any) -> None:
    _SCORING.reset(token)


def report(function: str, exc: BaseException | None, detail: str = "", env: Any = None) -> None:
    """Log the first failure of ``function`` in ``env`` (default: the one being scored), with its traceback."""
    env = env if env is not None else _SCORING.get()
    seen: set[str] | None = getattr(env, "_reward_failures_logged", None) if env is not None else None
    if env is not None and seen is None:
        seen = env._reward_failures_logged = set()
    if seen is not None:
        if function in seen:
            return
        seen.add(function)
    name = getattr(env, "name", "?")
    what = detail or (f"{type(exc).__name__}: {exc}" if exc is not None else "failed")
    log.warning(
        "environment '%s': reward function '%s' failed: %s (first failure, logged once; every failure "
        "scores 0 and is counted in reward/%s/errors)",
        name,
        function,
        what,
        name,
        exc_info=exc,
    )
