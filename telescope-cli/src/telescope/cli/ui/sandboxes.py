"""The Sandboxes page's data: the ``sandbox/*`` step metrics, and a step's slowest or failing commands.

A command is a ``sandbox`` span named ``execute`` on the timeline (``runtime/sandbox_report.py``).
The page lists, for one step, the failing ones first (a provider error, a timeout, an OOM kill, a
non-zero exit), then the slowest, with their command and the tails of their stdout and stderr,
each cut to ``TAIL_CHARS`` here (the page shows them as text, never as markup).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_COMMANDS", "TAIL_CHARS", "worst_commands"]

MAX_COMMANDS = 20
TAIL_CHARS = 1000
_FIELDS = ("sandbox_id", "provider", "env", "command", "exit_code", "duration_s", "timed_out", "oom", "cpu_s")


def _failing(attrs: dict[str, Any]) -> bool:
    return bool(
        attrs.get("failed")
        or attrs.get("timed_out")
        or attrs.get("oom")
        or attrs.get("exit_code") not in (0, None)
    ) or (attrs.get("exit_code") is None and "duration_s" not in attrs)


def worst_commands(events: list[dict[str, Any]], limit: int = MAX_COMMANDS) -> list[dict[str, Any]]:
    """The step's ``limit`` worst commands: failing ones, then the slowest; each with its tails cut."""
    ends = [
        e
        for e in events
        if e.get("type") == "sandbox" and e.get("name") == "execute" and e.get("phase") == "end"
    ]
    rows = []
    for event in ends:
        attrs = event.get("attrs") or {}
        row: dict[str, Any] = {k: attrs.get(k) for k in _FIELDS}
        row["failing"] = _failing(attrs)
        row["error"] = str(attrs.get("error") or "")[:TAIL_CHARS]
        row["stdout_tail"] = str(attrs.get("stdout_tail") or "")[-TAIL_CHARS:]
        row["stderr_tail"] = str(attrs.get("stderr_tail") or "")[-TAIL_CHARS:]
        row["duration_s"] = float(row["duration_s"] or 0.0)
        row["time"] = event.get("time")
        rows.append(row)
    rows.sort(key=lambda r: (not r["failing"], -float(r["duration_s"])))
    return rows[:limit]
