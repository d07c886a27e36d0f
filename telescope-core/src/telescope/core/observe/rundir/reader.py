"""Read a run directory back (used by ``telescope runs show`` and tests).

Works on a live run, a finished run and a killed one: readers skip a torn last line or frame,
and ``read_stats`` counts what was skipped. Reads schema 3 (compressed blocks) and the plain
JSONL of schemas 1 and 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from telescope.core.observe.rundir.blocks import block_files
from telescope.core.observe.rundir.jsonl import JsonlReadStats, read_jsonl
from telescope.core.observe.rundir.layout import (
    CONFIG_FILE,
    EVAL_METRICS_FILE,
    EVAL_SAMPLES_FILE,
    EVENTS_DIR,
    EVENTS_FILE,
    EVENTS_TAIL_FILE,
    LEGACY_EVENTS_TAIL_FILE,
    METRICS_FILE,
    ROLLOUTS_DIR,
    ROLLOUTS_FILE,
    RUN_FILE,
    SYSTEM_FILE,
)
from telescope.core.observe.rundir.records import SCHEMA_VERSION

__all__ = ["RunDirError", "RunDirReader", "read_run_meta"]


class RunDirError(ValueError):
    """The path is not a readable Telescope run directory."""


def read_run_meta(run_dir: str | Path) -> dict[str, Any]:
    """run.json of ``run_dir``; raises ``RunDirError`` when missing, unreadable or too new."""
    path = Path(run_dir) / RUN_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} is not a Telescope run directory: {RUN_FILE} is missing") from None
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path} is not valid JSON ({exc}): the run directory is damaged") from None
    version = meta.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(
            f"{path} has schema_version {version!r}; this Telescope reads up to {SCHEMA_VERSION}: "
            "upgrade telescope-core to read it"
        )
    return dict(meta)


class RunDirReader:
    """Typed access to the files of one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir)
        self.meta = read_run_meta(self.path)
        self.read_stats: dict[str, JsonlReadStats] = {}

    def config(self) -> dict[str, Any]:
        """The resolved config (``{}`` if config.yaml is missing)."""
        path = self.path / CONFIG_FILE
        if not path.exists():
            return {}
        return dict(yaml.safe_load(path.read_text(encoding="utf-8")) or {})

    def _read(self, fname: str) -> list[dict[str, Any]]:
        stats = JsonlReadStats()
        records = read_jsonl(self.path / fname, stats)
        self.read_stats[fname] = stats
        return records

    def steps(self) -> list[dict[str, Any]]:
        """metrics.jsonl records ``{"step", "time", "metrics"}``, in file order."""
        return self._read(METRICS_FILE)

    def metric_series(self, key: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` for one step-metric key (steps lacking it are skipped)."""
        out = []
        for rec in self.steps():
            value = rec.get("metrics", {}).get(key)
            if isinstance(value, int | float):
                out.append((int(rec["step"]), float(value)))
        return out

    def _read_blocks(self, folder: str, legacy_file: str, only: int | None = None) -> list[dict[str, Any]]:
        """Schema 1's single file (if any) then every ``folder/block_{k}.jsonl[.zst]`` in block
        order (only block ``only`` when given)."""
        records = self._read(legacy_file) if (self.path / legacy_file).exists() else []
        for index, path in block_files(self.path / folder):
            if only is None or index == only:
                records.extend(self._read(f"{folder}/{path.name}"))
        return records

    def problems(self) -> dict[str, str]:
        """``{file: what was skipped}`` for the files read so far that had torn, corrupt or
        malformed parts (empty when every read was clean)."""
        return {name: text for name, stats in self.read_stats.items() if (text := stats.problems())}

    def rollouts(self, step: int | None = None) -> list[dict[str, Any]]:
        """Rollout rows of every block (of one step when ``step`` is given)."""
        if step is not None:
            size = self.meta.get("layout", {}).get("rollout_block_size")
            if isinstance(size, int) and size > 0 and not (self.path / ROLLOUTS_FILE).exists():
                # schema 2+: only the block holding that step is read
                rows = self._read_blocks(ROLLOUTS_DIR, ROLLOUTS_FILE, only=max(step, 0) // size)
                return [r for r in rows if r.get("step") == step]
        rows = self._read_blocks(ROLLOUTS_DIR, ROLLOUTS_FILE)
        return rows if step is None else [r for r in rows if r.get("step") == step]

    def events(self) -> list[dict[str, Any]]:
        """Timeline events of every block, in the order they were written."""
        return self._read_blocks(EVENTS_DIR, EVENTS_FILE)

    def events_tail(self) -> list[dict[str, Any]]:
        """The events of the last ``event_tail_window_seconds`` as of the latest tail rewrite."""
        if not (self.path / EVENTS_TAIL_FILE).exists() and (self.path / LEGACY_EVENTS_TAIL_FILE).exists():
            return self._read(LEGACY_EVENTS_TAIL_FILE)
        return self._read(EVENTS_TAIL_FILE)

    def evals(self, name: str | None = None) -> list[dict[str, Any]]:
        """evals/metrics.jsonl records ``{"step", "name", "time", "metrics", "samples"}``."""
        records = self._read(EVAL_METRICS_FILE)
        return records if name is None else [r for r in records if r.get("name") == name]

    def latest_evals(self) -> dict[str, dict[str, Any]]:
        """``{eval name: its last record}`` (highest step, then latest written)."""
        latest: dict[str, dict[str, Any]] = {}
        for rec in self.evals():
            name = str(rec.get("name"))
            if name not in latest or int(rec.get("step", -1)) >= int(latest[name].get("step", -1)):
                latest[name] = rec
        return latest

    def eval_samples(self, name: str | None = None, step: int | None = None) -> list[dict[str, Any]]:
        """evals/samples.jsonl rows (filtered by eval name and/or step)."""
        rows = self._read(EVAL_SAMPLES_FILE)
        return [
            r
            for r in rows
            if (name is None or r.get("name") == name) and (step is None or r.get("step") == step)
        ]

    def system(self) -> list[dict[str, Any]]:
        return self._read(SYSTEM_FILE)
