"""The Sandboxes page's data: the ``sandbox/*`` step metrics, and a step's slowest or failing commands.

A command is a ``sandbox`` span named ``execute`` on the timeline (``runtime/sandbox_report.py``).
The page lists, for one step, the failing ones first (a provider error, a timeout, an OOM kill, a
non-zero exit), then the slowest, with their command and the tails of their stdout and stderr,
each cut to ``TAIL_CHARS`` here (the page shows them as text, never as markup). A ``sandbox/*``
metric no step of the run reported was not measured (``runtime/sandbox_report.py`` writes no 0 for
it): the page says so, with why (``not_measured``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_COMMANDS", "TAIL_CHARS", "not_measured", "worst_commands"]

MAX_COMMANDS = 20
TAIL_CHARS = 1000
_WHY = {
    "sandbox/cpu_s_per_sample": "the provider measured no command's CPU time in any step (the local "
    "provider cannot under bubblewrap without a cgroup v2 of its own)",
    "sandbox/create_to_ready_p50_s": "no sandbox was created in a recorded step",
    "sandbox/create_to_ready_p95_s": "no sandbox was created in a recorded step",
    "sandbox/exec_p50_s": "no command finished in a recorded step",
    "sandbox/exec_p95_s": "no command finished in a recorded step",
}
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


def not_measured(values: dict[str, list[Any]]) -> list[dict[str, str]]:
    """The ``sandbox/*`` metrics without a value at any step of ``values`` (a metrics series), each
    with why; none for a run without sandbox metrics at all."""
    from telescope.core.runtime.sandbox_report import METRICS

    if not any(v is not None for column in values.values() for v in column):
        return []
    missing = [k for k in METRICS if not any(v is not None for v in values.get(k, []))]
    return [{"key": k, "why": _WHY.get(k, "no step reported it")} for k in missing]
