"""Step metrics, system samples and eval records of one run, followed incrementally.

``MetricsStore`` follows ``metrics.jsonl``: one record per step, and a step logged again (a
resumed run continues from its checkpoint's step) replaces that step and drops every later
one the crashed process had logged, so the later record wins. ``RecordLog`` follows a file of
independent records (``system.jsonl``, ``evals/metrics.jsonl``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.cli.ui.confine import open_run_file
from telescope.core.observe.rundir.tail import open_tail, parse_json_line
from telescope.core.observe.stats import split_metric_key

__all__ = ["MetricKey", "MetricsStore", "RecordLog", "describe_key"]


@dataclass(frozen=True)
class MetricKey:
    """One step-metric key split by the seed's convention (see ``split_metric_key``)."""

    key: str
    section: str
    group: str
    metric: str


def describe_key(key: str) -> MetricKey:
    """Section/group/metric of ``key``; a malformed key (``a//b``) goes to General whole."""
    try:
        section, group, metric = split_metric_key(key)
    except ValueError:
        section, group, metric = "General", "", key
    return MetricKey(key, section, group, metric)


class _FollowedJsonl:
    """A JSONL file read incrementally into records (``_add``); ``_clear`` on a rewrite."""

    def __init__(self, path: Path) -> None:
        self._tail = open_tail(path, open_run_file)
        self.bad_lines = 0
        self.revision = 0
        """Bumped on every change, so pollers know when to fetch again."""

    @property
    def torn_tail(self) -> bool:
        return self._tail.torn_tail

    def refresh(self) -> bool:
        lines, reset = self._tail.read_lines()
        if reset:
            self._clear()
        for line in lines:
            self._add(parse_json_line(line.data))
        if lines or reset:
            self.revision += 1
        return bool(lines or reset)

    def _clear(self) -> None:
        raise NotImplementedError

    def _add(self, record: dict[str, Any] | None) -> None:
        raise NotImplementedError


class MetricsStore(_FollowedJsonl):
    """``metrics.jsonl`` as ``{step: (time, metrics)}`` (see module doc)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._records: dict[int, tuple[float, dict[str, Any]]] = {}
        self._steps: list[int] | None = None
        self._max_step: int | None = None
        self.keys: dict[str, MetricKey] = {}
        self.superseded = 0
        """Records dropped because a resumed run logged their step again."""

    def _clear(self) -> None:
        self._records.clear()
        self._max_step = None
        self._steps = None

    def _add(self, record: dict[str, Any] | None) -> None:
        step = record.get("step") if record else None
        metrics = record.get("metrics") if record else None
        if record is None or not isinstance(step, int) or not isinstance(metrics, dict):
            self.bad_lines += 1
            return
        if self._max_step is not None and step <= self._max_step:
            stale = [s for s in self._records if s >= step]
            self.superseded += len(stale)
            for s in stale:
                del self._records[s]
        self._records[step] = (float(record.get("time") or 0.0), metrics)
        self._max_step = step
        self._steps = None
        for key in metrics:
            if key not in self.keys:
                self.keys[key] = describe_key(key)

    def steps(self) -> list[int]:
        if self._steps is None:
            self._steps = sorted(self._records)
        return self._steps

    def last(self) -> tuple[int, float, dict[str, Any]] | None:
        steps = self.steps()
        if not steps:
            return None
        time, metrics = self._records[steps[-1]]
        return steps[-1], time, metrics

    def series(self, keys: list[str]) -> dict[str, Any]:
        """``{"step": [...], "time": [...], "values": {key: [value or None, ...]}}``, by step."""
        steps = self.steps()
        out: dict[str, Any] = {"step": steps, "time": [self._records[s][0] for s in steps]}
        values: dict[str, list[Any]] = {}
        for key in keys:
            column = [self._records[s][1].get(key) for s in steps]
            values[key] = [
                v if isinstance(v, int | float) and not isinstance(v, bool) else None for v in column
            ]
        out["values"] = values
        return out

    def record(self, step: int) -> dict[str, Any] | None:
        found = self._records.get(step)
        return None if found is None else {"step": step, "time": found[0], "metrics": found[1]}


class RecordLog(_FollowedJsonl):
    """Every record of an append-only JSONL file, kept in memory up to ``max_records`` (newest)."""

    def __init__(self, path: Path, max_records: int = 200_000) -> None:
        super().__init__(path)
        self.records: deque[dict[str, Any]] = deque(maxlen=max_records)

    def _clear(self) -> None:
        self.records.clear()

    def _add(self, record: dict[str, Any] | None) -> None:
        if record is None:
            self.bad_lines += 1
        else:
            self.records.append(record)
