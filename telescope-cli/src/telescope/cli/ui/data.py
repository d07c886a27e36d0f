"""The dashboard's data API: the runs under the given paths and everything each one logged.

``Workspace`` finds run directories (a run directory itself, or a folder whose subfolders, up
to two levels down, hold ``run.json``) and keeps one ``RunData`` per run. ``RunData`` reads the
run directory (docs/run-directory.md, schema 1 and 2) incrementally: every call first reads
what was appended since the previous one (at most every ``refresh_s`` seconds), so a live run's
new steps, rollouts, events and log lines show up without a reload, and a killed run's torn
last lines are skipped. Rollouts and events are indexed by step and parsed only for the steps
asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from telescope.cli.commands.runs import HIGHLIGHT_KEYS
from telescope.cli.health import run_health
from telescope.cli.ui.confine import OutsideRunDir, check_inside, open_run_file
from telescope.cli.ui.logs import LogStore
from telescope.cli.ui.metric_docs import describe, without_duplicates
from telescope.cli.ui.records import MetricsStore, RecordLog
from telescope.cli.ui.rollouts import RolloutFilter, RolloutStore
from telescope.cli.ui.timeline import EventStore, build_spans, trainer_phases
from telescope.core.models.tiny import builtin_model_name
from telescope.core.observe.rundir.layout import (
    CONFIG_FILE,
    EVAL_METRICS_FILE,
    EVAL_SAMPLES_FILE,
    EVALS_DIR,
    EVENTS_DIR,
    EVENTS_FILE,
    LOGS_DIR,
    METRICS_FILE,
    ROLLOUTS_DIR,
    ROLLOUTS_FILE,
    RUN_FILE,
    SYSTEM_FILE,
)
from telescope.core.observe.rundir.reader import RunDirError, read_run_meta

__all__ = ["RunData", "Workspace", "declared_ranges"]

#: A ``running`` run that recorded no ``progress`` (older than it) and wrote nothing for this
#: long is shown as stale (it may have been killed). A run with ``progress`` is judged by that.
STALE_AFTER_S = 300.0
#: The Runs page's reward sparkline: at most this many latest steps.
SPARK_STEPS = 60
#: At most this many steps per timeline query (each step may hold thousands of events).
MAX_TIMELINE_STEPS = 50
#: A timeline query reads the event blocks written from this many steps before its first step ...
TIMELINE_LEAD_STEPS = 3
#: ... to this many seconds after its last step was logged.
TIMELINE_SLACK_S = 300.0


def _range(entry: Any) -> tuple[float, float] | None:
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("min"), int | float)
        and isinstance(entry.get("max"), int | float)
    ):
        return float(entry["min"]), float(entry["max"])
    return None


def _union(ranges: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The range covering all, or None when any is undeclared (then the observed range is used)."""
    if not ranges or any(r is None for r in ranges):
        return None
    return min(r[0] for r in ranges if r), max(r[1] for r in ranges if r)


def declared_ranges(info: dict[str, Any], keys: list[str]) -> dict[str, list[float]]:
    """``{metric key: [min, max]}`` from the environments' ``reward_min``/``reward_max`` and
    ``metrics_ranges`` (run.json ``info``) for the keys they bound: the mean/min/max of
    ``reward``, ``reward/<env>`` and ``sample_metrics/<name>`` (std and Gini are not bounded)."""
    envs = [e for e in info.get("environments") or [] if isinstance(e, dict)]
    reward_by_env: dict[str, tuple[float, float] | None] = {
        str(e.get("name")): _range({"min": e.get("reward_min"), "max": e.get("reward_max")}) for e in envs
    }
    if not envs:
        for name, entry in (info.get("reward_ranges") or {}).items():
            reward_by_env[str(name)] = _range(entry)
    metric_ranges: dict[str, list[tuple[float, float] | None]] = {}
    for env in envs:
        for name, entry in (env.get("metrics_ranges") or {}).items():
            metric_ranges.setdefault(str(name), []).append(_range(entry))
    out: dict[str, list[float]] = {}
    for key in keys:
        parts = key.split("/")
        if parts[-1] not in ("mean", "min", "max") or len(parts) < 2:
            continue
        found = None
        if parts[0] == "reward" and len(parts) == 2:
            found = _union(list(reward_by_env.values()))
        elif parts[0] == "reward" and len(parts) == 3:
            found = reward_by_env.get(parts[1])
        elif parts[0] == "sample_metrics" and len(parts) == 3:
            found = _union(metric_ranges.get(parts[1], []))
        if found is not None:
            out[key] = [found[0], found[1]]
    return out


class RunData:
    """One run directory, read incrementally (see module doc)."""

    #: What a run directory holds: none of it may resolve outside the run (``check_confined``).
    ENTRIES = (
        RUN_FILE,
        CONFIG_FILE,
        METRICS_FILE,
        SYSTEM_FILE,
        ROLLOUTS_FILE,
        EVENTS_FILE,
        ROLLOUTS_DIR,
        EVENTS_DIR,
        EVALS_DIR,
        EVAL_METRICS_FILE,
        EVAL_SAMPLES_FILE,
        LOGS_DIR,
    )

    def __init__(self, path: Path, key: str, *, refresh_s: float = 0.5) -> None:
        self.path = Path(path)
        self.key = key
        check_inside(self.path / RUN_FILE, self.path)
        self.meta = read_run_meta(self.path)
        self.refresh_s = refresh_s
        self._lock = threading.RLock()
        self._last_refresh = 0.0
        self._meta_mtime = 0
        self._config: tuple[int, dict[str, Any]] = (-1, {})
        self._system_cache: tuple[tuple[int, int], dict[str, Any]] = ((-1, 0), {})
        self.metrics = MetricsStore(self.path / METRICS_FILE)
        self.system = RecordLog(self.path / SYSTEM_FILE)
        self.evals = RecordLog(self.path / EVAL_METRICS_FILE)
        self.rollouts = RolloutStore(self.path, (self.meta.get("layout") or {}).get("rollout_block_size"))
        self.rollouts.monotonic = self._never_resumed()
        layout = self.meta.get("layout") or {}
        self.events = EventStore(
            self.path, self.meta.get("created_at"), layout.get("event_block_duration_seconds")
        )
        self.logs = LogStore(self.path)

    def check_confined(self) -> None:
        """Raise ``OutsideRunDir`` when a file or folder of the run is a symbolic link out of it (the
        files inside ``rollouts/``, ``events/`` and ``logs/`` are checked as they are opened)."""
        for name in self.ENTRIES:
            path = self.path / name
            if path.is_symlink():
                check_inside(path, self.path)

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self, *, force: bool = False) -> None:
        """Read what was appended since the last refresh (metrics, system, evals, run.json)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_refresh < self.refresh_s:
                return
            self._last_refresh = now
            self._refresh_meta()
            self.metrics.refresh()
            self.system.refresh()
            self.evals.refresh()

    def _refresh_meta(self) -> None:
        try:
            mtime = (self.path / RUN_FILE).stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._meta_mtime:
            try:
                self.meta = read_run_meta(self.path)
                self._meta_mtime = mtime
            except RunDirError:
                pass  # a half-visible rewrite cannot happen (atomic rename); keep the last good one
            self.rollouts.monotonic = self._never_resumed()

    def _never_resumed(self) -> bool:
        return int(self.meta.get("starts") or 1) <= 1 and "resume" not in (self.meta.get("info") or {})

    def config(self) -> dict[str, Any]:
        path = self.path / CONFIG_FILE
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if mtime != self._config[0]:
            with open_run_file(path) as f:
                self._config = (mtime, dict(yaml.safe_load(f.read().decode("utf-8")) or {}))
        return self._config[1]

    # ---- queries ---------------------------------------------------------------------------
    def last_write(self) -> float:
        times = []
        for name in (METRICS_FILE, RUN_FILE, SYSTEM_FILE, "logs/telescope.log"):
            try:
                times.append((self.path / name).stat().st_mtime)
            except FileNotFoundError:
                continue
        return max(times, default=0.0)

    def summary(self) -> dict[str, Any]:
        """Status, steps, latest reward, config highlights: a row of the Runs page."""
        self.refresh()
        meta, cfg = self.meta, self.config()
        last = self.metrics.last()
        last_write = self.last_write()
        status = str(meta.get("status"))
        health = run_health(meta, time.time())
        stale = status == "running" and (
            health["state"] == "overdue"
            or (health["state"] == "unknown" and time.time() - last_write > STALE_AFTER_S)
        )
        highlights = {k: cfg[k] for k in HIGHLIGHT_KEYS if k in cfg}
        if "model" in highlights:  # as the user named it, not the built-in model's cache folder
            named = (meta.get("info") or {}).get("model")
            highlights["model"] = str(named) if named else builtin_model_name(str(highlights["model"]))
        if isinstance(highlights.get("environments"), list):
            highlights["environments"] = ", ".join(
                str(e.get("name", e)) if isinstance(e, dict) else str(e) for e in highlights["environments"]
            )
        metrics = last[2] if last else {}
        return {
            "key": self.key,
            "path": str(self.path),
            "name": meta.get("name") or self.path.name,
            "run_id": meta.get("run_id"),
            "status": status,
            "stale": stale,
            "schema_version": meta.get("schema_version"),
            "created_at": meta.get("created_at"),
            "started_at": meta.get("started_at"),
            "finished_at": meta.get("finished_at"),
            "starts": meta.get("starts", 1),
            "last_write": last_write,
            "step": last[0] if last else None,
            "steps_logged": len(self.metrics.steps()),
            "number_of_steps": cfg.get("number_of_steps"),
            "reward": metrics.get("reward/mean"),
            "highlights": highlights,
            "health": health,
            "reward_trend": self._reward_trend(),
            "eta_s": _eta(health, last[0] if last else None, cfg.get("number_of_steps")),
            "failure": ((meta.get("info") or {}).get("failure") or {}).get("reason"),
            "read": self.read_health(),
        }

    def _reward_trend(self) -> list[float | None]:
        values = self.metrics.series(["reward/mean"])["values"].get("reward/mean") or []
        return list(values[-SPARK_STEPS:])

    def read_health(self) -> dict[str, Any]:
        """What the readers skipped: torn last lines, malformed lines and torn or corrupt compressed
        frames, per file."""
        out: dict[str, Any] = {}
        for name, store in (
            (METRICS_FILE, self.metrics),
            (SYSTEM_FILE, self.system),
            (EVAL_METRICS_FILE, self.evals),
        ):
            if store.torn_tail or store.bad_lines:
                out[name] = {"torn_tail": store.torn_tail, "bad_lines": store.bad_lines}
        # the rollout and event blocks indexed so far (a torn end of an open block is a write in progress)
        for index in [*self.rollouts.all_indexes(), *self.events.all_indexes()]:
            if index.bad_lines or index.skipped_frames:
                name = index.path.relative_to(self.path).as_posix()
                out[name] = {"bad_lines": index.bad_lines, "skipped_frames": index.skipped_frames}
        if self.metrics.superseded:
            out["superseded_steps"] = self.metrics.superseded
        return out

    def catalog(self) -> dict[str, Any]:
        """Every step-metric key with its section, group and declared range."""
        self.refresh()
        keys = without_duplicates(sorted(self.metrics.keys))
        ranges = declared_ranges(self.meta.get("info") or {}, keys)
        items = [
            {
                "key": k,
                "section": m.section,
                "group": m.group,
                "metric": m.metric,
                "range": ranges.get(k),
                "description": describe(k),
            }
            for k, m in ((k, self.metrics.keys[k]) for k in keys)
        ]
        return {"keys": items, "revision": self.metrics.revision}

    def metric_series(self, keys: list[str]) -> dict[str, Any]:
        self.refresh()
        out = self.metrics.series(keys)
        out["revision"] = self.metrics.revision
        out["created_at"] = self.meta.get("created_at")
        return out

    def rollout_steps(self) -> list[int]:
        self.refresh()
        return sorted(set(self.metrics.steps()) | set(self.rollouts.steps()))

    def rollout_query(self, step: int | None, flt: RolloutFilter, **kw: Any) -> dict[str, Any]:
        self.refresh()
        if step is None:
            steps = self.metrics.steps() or self.rollouts.steps()
            step = steps[-1] if steps else 0
        with self._lock:
            return self.rollouts.query(step, flt, **kw)

    def sample(self, step: int, group_id: int, sample_id: int) -> dict[str, Any] | None:
        with self._lock:
            return self.rollouts.sample(step, group_id, sample_id)

    def group(self, step: int, group_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return self.rollouts.group(step, group_id)

    def sandboxes(self, step: int | None) -> dict[str, Any]:
        """The Sandboxes page: every ``sandbox/*`` metric by step, those never measured, and the worst
        commands of ``step`` (default: the last one)."""
        from telescope.cli.ui.sandboxes import not_measured, worst_commands

        self.refresh()
        steps = self.metrics.steps() or self.events.steps()
        step = step if step is not None else (steps[-1] if steps else 0)
        with self._lock:
            events = self.events.events(step, step)
            series = self.metrics.series(sorted(k for k in self.metrics.keys if k.startswith("sandbox/")))
        return {
            "step": step,
            "steps": steps,
            "series": series,
            "not_measured": not_measured(series["values"]),
            "commands": worst_commands(events),
        }

    def timeline(self, lo: int, hi: int) -> dict[str, Any]:
        """Spans and instants of steps lo..hi (at most ``MAX_TIMELINE_STEPS``)."""
        self.refresh()
        if hi - lo + 1 > MAX_TIMELINE_STEPS:
            raise ValueError(
                f"timeline of steps {lo}..{hi} is too wide: ask for at most {MAX_TIMELINE_STEPS} steps"
            )
        with self._lock:
            # a sample started while step lo-1 was being filled may end in step lo
            window = self._time_window(lo, hi)
            events = self.events.events(lo - 1, hi, window)
            spans, instants = build_spans(events)
            spans = [
                s for s in spans if s["step"] >= lo or (s["end_step"] is not None and s["end_step"] >= lo)
            ]
            instants = [i for i in instants if i["step"] >= lo]
            if spans or instants:
                t0 = min([s["start"] for s in spans] + [float(i["time"] or 0) for i in instants])
                t1 = max([s["end"] for s in spans] + [float(i["time"] or 0) for i in instants])
                marks = [
                    e for e in self.events.unstepped_events((t0, t1)) if t0 <= float(e.get("time") or 0) <= t1
                ]
                instants += build_spans(marks)[1]
        spans += trainer_phases(spans, lambda s: (self.metrics.record(s) or {}).get("metrics"))
        steps = self.metrics.steps()
        return {
            "lo": lo,
            "hi": hi,
            "spans": spans,
            "instants": instants,
            "steps": [steps[0], steps[-1]] if steps else [],
        }

    def _time_window(self, lo: int, hi: int) -> tuple[float, float]:
        """When the events of steps lo..hi were written, from the step metrics' times, widely:
        from the end of a step a few before ``lo`` (async generation starts early) to a while
        after ``hi`` (an unlogged step: up to now)."""
        steps = self.metrics.steps()
        before = [s for s in steps if s < lo - TIMELINE_LEAD_STEPS]
        start = (self.metrics.record(before[-1]) or {}).get("time") if before else None
        end = (self.metrics.record(hi) or {}).get("time")
        return (
            float(start) if start else float("-inf"),
            float(end) + TIMELINE_SLACK_S if end else float("inf"),
        )

    def system_series(self, max_points: int = 2000) -> dict[str, Any]:
        """System/vLLM/torch samples grouped into series ``{source label: {"time", "values"}}``,
        each thinned to about ``max_points`` samples; computed once per change of system.jsonl
        (a live run's Infra page asks every second, with up to 200,000 samples in memory)."""
        self.refresh()
        with self._lock:  # the deque is appended to by a refresh in another request's thread
            key = (self.system.revision, max_points)
            if self._system_cache[0] != key:
                self._system_cache = (key, _system_groups(self.system.records, max_points))
            return {"series": self._system_cache[1], "revision": self.system.revision}

    def eval_records(self) -> dict[str, Any]:
        self.refresh()
        return {"records": list(self.evals.records), "revision": self.evals.revision}

    def eval_samples(self, name: str, step: int, limit: int = 200) -> list[dict[str, Any]]:
        from telescope.core.observe.rundir.jsonl import iter_jsonl

        out = []
        for row in iter_jsonl(self.path / EVAL_SAMPLES_FILE):
            if row.get("name") == name and row.get("step") == step:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    def revisions(self) -> dict[str, Any]:
        """Counters the page polls: when one changes, it fetches that data again."""
        self.refresh()
        last = self.metrics.last()
        return {
            "metrics": self.metrics.revision,
            "system": self.system.revision,
            "evals": self.evals.revision,
            "step": last[0] if last else None,
            "status": self.meta.get("status"),
            "last_write": self.last_write(),
            "health": run_health(self.meta, time.time()),
        }


def _eta(health: dict[str, Any], step: int | None, total: Any) -> float | None:
    """Seconds to the last step at the median step time (None when unknown or not running)."""
    median = health.get("median_step")
    if (
        health.get("state") in ("ended", "unknown")
        or median is None
        or step is None
        or not isinstance(total, int)
    ):
        return None
    return max(0, total - step) * float(median)


def _system_groups(records: Iterable[dict[str, Any]], max_points: int) -> dict[str, dict[str, Any]]:
    """Samples per source label, one column per metric aligned with its times (None where a
    sample lacks it), every ``len // max_points``-th sample kept."""
    groups: dict[str, dict[str, Any]] = {}
    for rec in records:
        g = groups.setdefault(_source_label(rec), {"time": [], "values": {}})
        i = len(g["time"])
        g["time"].append(rec.get("time"))
        values: dict[str, list[Any]] = g["values"]
        for key, value in (rec.get("metrics") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                column = values.get(key)
                if column is None:  # first seen now: None for the samples before
                    column = values[key] = [None] * i
                column.append(value)
        for column in values.values():
            if len(column) <= i:  # a metric this sample lacks
                column.append(None)
    for g in groups.values():
        stride = max(1, len(g["time"]) // max_points)
        g["time"] = g["time"][::stride]
        g["values"] = {k: v[::stride] for k, v in g["values"].items()}
    return groups


def _source_label(rec: dict[str, Any]) -> str:
    source = str(rec.get("source") or "system")
    if source == "vllm":
        return f"vllm server {rec.get('server', '?')}"
    if source == "torch":
        return f"torch rank {rec.get('rank', '?')}"
    node = rec.get("node")
    return f"system {node}" if node else "system"


class Workspace:
    """The runs under the paths given to ``telescope ui`` (rescanned for new runs)."""

    def __init__(self, paths: list[Path], *, rescan_s: float = 2.0) -> None:
        self.paths = [Path(p) for p in paths]
        missing = [str(p) for p in self.paths if not p.exists()]
        if missing:
            raise RunDirError(
                f"no such folder: {', '.join(missing)} (pass a run directory or a folder of runs)"
            )
        self.rescan_s = rescan_s
        self._runs: dict[str, RunData] = {}
        self._by_path: dict[Path, str] = {}
        self._last_scan = 0.0
        self.errors: dict[str, str] = {}
        self.scan(force=True)

    def _candidates(self) -> list[Path]:
        found: list[Path] = []
        for root in self.paths:
            if (root / RUN_FILE).exists():
                found.append(root)
                continue
            for depth_glob in ("*/" + RUN_FILE, "*/*/" + RUN_FILE):
                found.extend(sorted(p.parent for p in root.glob(depth_glob)))
        return found

    def scan(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_scan < self.rescan_s:
            return
        self._last_scan = now
        for path in self._candidates():
            resolved = path.resolve()
            if resolved in self._by_path:
                continue
            key = self._key_for(path)
            try:
                self._runs[key] = RunData(path, key)
                self._by_path[resolved] = key
                self.errors.pop(str(path), None)
            except (RunDirError, OutsideRunDir) as exc:
                self.errors[str(path)] = str(exc)

    def _key_for(self, path: Path) -> str:
        key = path.name or "run"
        if key in self._runs:
            key = f"{path.parent.name}-{path.name}"
        n = 2
        base = key
        while key in self._runs:
            key, n = f"{base}-{n}", n + 1
        return key

    def runs(self) -> list[RunData]:
        self.scan()
        return list(self._runs.values())

    def get(self, key: str) -> RunData:
        self.scan()
        if key not in self._runs:
            raise KeyError(f"no run {key!r}: known runs are {', '.join(sorted(self._runs)) or 'none'}")
        run = self._runs[key]
        run.check_confined()
        return run
