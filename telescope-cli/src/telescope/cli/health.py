"""A run's health from what it recorded in run.json ``progress`` (never from file writes).

``progress`` (written by the local logger at each step, docs/run-directory.md) holds the step in
progress, when it started and the recent step durations. The current step is *slow* once it
has run ``SLOW_FACTOR`` times the median step (and ``SLOW_SLACK_S`` more), *overdue* at
``OVERDUE_FACTOR`` times (and ``OVERDUE_SLACK_S`` more). ``telescope runs show`` and every
dashboard page say the same line.
"""

from __future__ import annotations

import statistics
from typing import Any

from telescope.core.observe.loggers.progress import format_duration, format_seconds

__all__ = ["OVERDUE_FACTOR", "SLOW_FACTOR", "run_health"]

SLOW_FACTOR = 2.0
SLOW_SLACK_S = 10.0
OVERDUE_FACTOR = 5.0
OVERDUE_SLACK_S = 60.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _state(running_for: float, median: float | None) -> str:
    if median is None:
        return "ok"  # no step timed yet (the first one holds the set-up): nothing to compare with
    if running_for > max(OVERDUE_FACTOR * median, median + OVERDUE_SLACK_S):
        return "overdue"
    if running_for > max(SLOW_FACTOR * median, median + SLOW_SLACK_S):
        return "slow"
    return "ok"


def run_health(meta: dict[str, Any], now: float) -> dict[str, Any]:
    """``{state, step, running_for, median_step, last_step, last_step_ago, text}``.

    ``state``: ``ok``, ``slow`` (yellow), ``overdue`` (red), ``ended`` (not running) or
    ``unknown`` (a run.json without ``progress``: written before it was recorded).
    """
    progress = meta.get("progress") if isinstance(meta.get("progress"), dict) else None
    status = str(meta.get("status"))
    if progress is None:
        return {"state": "unknown" if status == "running" else "ended", "text": ""}
    recent = [v for v in (_number(x) for x in progress.get("recent_step_seconds") or []) if v is not None]
    median = statistics.median(recent) if recent else None
    last_at = _number(progress.get("last_step_at"))
    last_ago = now - last_at if last_at is not None else None
    out: dict[str, Any] = {
        "step": progress.get("step"),
        "median_step": median,
        "last_step": progress.get("last_step"),
        "last_step_ago": last_ago,
        "running_for": None,
    }
    last = f"last step {format_duration(last_ago)} ago" if last_ago is not None else "no step logged yet"
    started = _number(progress.get("step_started_at"))
    if status != "running" or started is None:
        return {**out, "state": "ended", "text": last}
    running_for = max(0.0, now - started)
    step = progress.get("step")
    what = f"step {step}" if step is not None else "first step"
    typical = f" (median step {format_seconds(median)})" if median is not None else ""
    text = f"{what} running for {format_duration(running_for)}{typical} · {last}"
    return {**out, "state": _state(running_for, median), "running_for": running_for, "text": text}
