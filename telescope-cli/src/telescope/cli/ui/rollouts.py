"""Rollouts of a run by step: block indexes, filters, per-step aggregates, one sample in full.

Only the block holding a requested step is indexed (``StepIndex``), and only that step's lines
are parsed, so a multi-GB rollout history is never read whole. Schema 1's single
``rollouts.jsonl`` is indexed the same way, as one more block. Blocks are read through core's
record-file readers (``telescope.core.observe.rundir.tail``), compressed or plain alike.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.cli.ui.confine import open_run_file
from telescope.cli.ui.index import StepIndex, bisect_step_spans
from telescope.core.observe.rundir.blocks import block_files, block_index
from telescope.core.observe.rundir.frames import ZSTD_SUFFIX
from telescope.core.observe.rundir.layout import ROLLOUTS_DIR, ROLLOUTS_FILE
from telescope.core.observe.rundir.tail import FileTail, parse_json_line
from telescope.core.observe.stats import gini, summary

__all__ = ["RolloutFilter", "RolloutStore", "outcome_of", "step_summary"]

#: Characters of prompt/completion text sent with a list row (the full text comes with the sample).
PREVIEW_CHARS = 240
#: Fields of a list row besides the previews (token id lists stay on disk).
LIST_FIELDS = (
    "step",
    "group_id",
    "sample_id",
    "env",
    "reward",
    "raw_reward",
    "advantage",
    "kept",
    "discard_reason",
    "zero_advantage_kind",
    "stop_reason",
    "prompt_tokens",
    "completion_tokens",
    "model_version",
    "off_policy_steps",
    "server",
    "lane",
    "num_turns",
    "sample_metrics",
    "prompt_idx",
    "sample_tags",
    "env_stop_reason",
)
#: Reasons a rollout was stopped in flight; every other reason is a discard of a finished one
#: (``max_async``, ``zero_advantage``, and whatever a newer runtime or a plugin writes).
CANCEL_REASONS = ("off_policy", "eval_drain")


def outcome_of(row: dict[str, Any]) -> str:
    """``kept``, or the discard/cancel reason (``max_async``, ``zero_advantage``, ``off_policy`` ...)."""
    reason = row.get("discard_reason")
    return "kept" if not reason else str(reason)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class RolloutFilter:
    """What the Rollouts page asks for; every field None means "any"."""

    env: str | None = None
    outcome: str | None = None
    """``kept``, ``discarded`` (any discard), ``cancelled``, or one reason (``max_async`` ...)."""
    reward_min: float | None = None
    reward_max: float | None = None
    advantage_min: float | None = None
    advantage_max: float | None = None
    length_min: int | None = None
    length_max: int | None = None
    """Completion tokens."""
    text: str | None = None
    """Case-insensitive substring of the prompt or completion."""
    group_id: int | None = None
    tag: str | None = None
    """``key=value``: rows whose ``sample_tags[key] == value``."""

    def matches(self, row: dict[str, Any]) -> bool:
        return all(check(self, row) for check in _CHECKS)


def _between(value: float | None, lo: float | None, hi: float | None) -> bool:
    if lo is None and hi is None:
        return True
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _outcome_ok(f: RolloutFilter, row: dict[str, Any]) -> bool:
    if not f.outcome:
        return True
    outcome = outcome_of(row)
    if f.outcome == "discarded":
        return outcome != "kept" and outcome not in CANCEL_REASONS
    if f.outcome == "cancelled":
        return outcome in CANCEL_REASONS
    return outcome == f.outcome


def _tag_ok(f: RolloutFilter, row: dict[str, Any]) -> bool:
    if not f.tag:
        return True
    key, _, value = f.tag.partition("=")
    return str((row.get("sample_tags") or {}).get(key)) == value


def _text_ok(f: RolloutFilter, row: dict[str, Any]) -> bool:
    if not f.text:
        return True
    needle = f.text.lower()
    return (
        needle in str(row.get("prompt_text", "")).lower()
        or needle in str(row.get("completion_text", "")).lower()
    )


_CHECKS = (
    lambda f, r: f.env is None or r.get("env") == f.env,
    lambda f, r: f.group_id is None or r.get("group_id") == f.group_id,
    _outcome_ok,
    lambda f, r: _between(_num(r.get("reward")), f.reward_min, f.reward_max),
    lambda f, r: _between(_num(r.get("advantage")), f.advantage_min, f.advantage_max),
    lambda f, r: _between(_num(r.get("completion_tokens")), f.length_min, f.length_max),
    _text_ok,
    _tag_ok,
)


def list_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row for the list: scalar fields and short previews of the texts."""
    out = {k: row.get(k) for k in LIST_FIELDS}
    out["completion_tokens"] = row.get("completion_tokens", len(row.get("completion_ids") or []))
    out["prompt_tokens"] = row.get("prompt_tokens", len(row.get("prompt_ids") or []))
    out["outcome"] = outcome_of(row)
    out["prompt_preview"] = str(row.get("prompt_text", ""))[-PREVIEW_CHARS:]
    out["completion_preview"] = str(row.get("completion_text", ""))[:PREVIEW_CHARS]
    return out


#: Columns of the list a ``sort=`` may name (``-`` in front: descending).
SORT_KEYS = (
    "group_id",
    "sample_id",
    "env",
    "reward",
    "advantage",
    "outcome",
    "stop_reason",
    "completion_tokens",
)


def sort_rows(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    """List rows sorted by one column: numbers by value, text alphabetically, missing values last."""
    key, descending = sort.lstrip("-"), sort.startswith("-")
    if key not in SORT_KEYS:
        raise ValueError(
            f"sort={sort!r} is not a rollout column: use one of {', '.join(SORT_KEYS)} ('-' for descending)"
        )
    present = [
        r
        for r in rows
        if r.get(key) is not None and not (isinstance(r.get(key), float) and math.isnan(r[key]))
    ]
    kept_ids = {id(r) for r in present}
    missing = [r for r in rows if id(r) not in kept_ids]
    numeric = all(isinstance(r[key], int | float) for r in present)
    present.sort(key=lambda r: r[key] if numeric else str(r[key]), reverse=descending)
    return present + missing


def _groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    by_group: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_group[r.get("group_id")].append(r)
    return list(by_group.values())


def _stats_with_gini(groups: list[list[float]]) -> dict[str, float]:
    flat = [v for g in groups for v in g]
    out = summary(flat)
    if flat:
        out["gini_mean"] = sum(gini(g) for g in groups) / len(groups)
    return out


def step_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcome counts and, over the kept rows, reward/advantage/length/sample-metric statistics
    (mean, std, min, max; Gini within each prompt group, averaged over groups)."""
    kept = [r for r in rows if outcome_of(r) == "kept"]
    groups = _groups(kept)
    out: dict[str, Any] = {"outcomes": dict(Counter(outcome_of(r) for r in rows)), "rows": len(rows)}
    out["reward"] = _stats_with_gini([[float(_num(r.get("reward")) or 0.0) for r in g] for g in groups])
    out["advantage"] = summary([float(_num(r.get("advantage")) or 0.0) for r in kept])
    out["completion_tokens"] = _stats_with_gini(
        [[float(_num(r.get("completion_tokens")) or 0.0) for r in g] for g in groups]
    )
    names = sorted({k for r in kept for k in (r.get("sample_metrics") or {})})
    metrics = {}
    for name in names:
        per_group = [
            [v for r in g if (v := _num((r.get("sample_metrics") or {}).get(name))) is not None]
            for g in groups
        ]
        metrics[name] = _stats_with_gini([g for g in per_group if g])
    out["sample_metrics"] = metrics
    out["envs"] = sorted({str(r.get("env")) for r in rows})
    out["tags"] = sorted({f"{k}={v}" for r in rows for k, v in (r.get("sample_tags") or {}).items()})
    return out


class RolloutStore:
    """The rollout blocks of one run directory (see module doc)."""

    def __init__(self, run_dir: Path, block_size: int | None) -> None:
        self.run_dir = Path(run_dir)
        self.block_size = block_size if isinstance(block_size, int) and block_size > 0 else None
        self._indexes: dict[Path, StepIndex] = {}
        self.monotonic = False
        """True while the run never resumed: its blocks' steps never go down, so one step's rows
        can be found by binary search before the block is indexed (``bisect_step_spans``)."""

    def _files(self) -> list[Path]:
        legacy = self.run_dir / ROLLOUTS_FILE
        files = [legacy] if legacy.exists() else []
        return files + [p for _, p in block_files(self.run_dir / ROLLOUTS_DIR)]

    def _files_for(self, lo: int, hi: int) -> list[Path]:
        """The files that can hold steps lo..hi (schema 2 with a layout: just their blocks)."""
        files = self._files()
        if self.block_size is None or (self.run_dir / ROLLOUTS_FILE).exists():
            return files
        wanted = {max(s, 0) // self.block_size for s in range(lo, hi + 1)}
        return [p for p in files if block_index(p) in wanted]

    def _index(self, path: Path, *, refresh: bool = True) -> StepIndex:
        index = self._indexes.get(path)
        if index is None:
            index = self._indexes[path] = StepIndex(path)
        if refresh:
            index.refresh()
        return index

    def all_indexes(self) -> list[StepIndex]:
        """An index per rollout file (not refreshed: the server warms them in the background)."""
        return [self._index(p, refresh=False) for p in self._files()]

    def rows(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Every rollout record of steps lo..hi (inclusive), in file order."""
        out: list[dict[str, Any]] = []
        for path in self._files_for(lo, hi):
            index = self._indexes.get(path)
            plain = not path.name.endswith(ZSTD_SUFFIX)  # a compressed block has no byte offsets to bisect
            if plain and self.monotonic and lo == hi and (index is None or index.pending()):
                spans = bisect_step_spans(path, lo)  # the block is not (fully) indexed yet
                lines = FileTail(path, open_run_file).read_at(spans) if spans else []
            else:
                index = self._index(path)
                spans = index.spans(lo, hi)
                lines = index.read_at(spans) if spans else []
            out.extend(r for r in map(parse_json_line, lines) if r is not None)
        return out

    def steps(self) -> list[int]:
        """Steps with rollouts in the blocks indexed so far (a request never waits for a whole
        block to be indexed just to list steps; the metrics' steps cover the rest)."""
        return sorted({s for index in self._indexes.values() for s in index.step_numbers()})

    def query(
        self, step: int, flt: RolloutFilter, *, limit: int = 200, offset: int = 0, sort: str = ""
    ) -> dict[str, Any]:
        """The Rollouts page's data for one step: matching list rows, their count, the step's summary."""
        rows = self.rows(step, step)
        matched = [list_row(r) for r in rows if flt.matches(r)]
        if sort:
            matched = sort_rows(matched, sort)
        everything = step_summary(rows)
        return {
            "step": step,
            "total": len(rows),
            "matched": len(matched),
            "rows": matched[offset : offset + limit],
            # the summary is over the rows the filters let through; the filters' choices over all
            "summary": step_summary([r for r in rows if flt.matches(r)]),
            "options": {
                "envs": everything["envs"],
                "tags": everything["tags"],
                "outcomes": everything["outcomes"],
            },
        }

    def sample(self, step: int, group_id: int, sample_id: int) -> dict[str, Any] | None:
        """One rollout record in full (the last one logged with these ids)."""
        found = None
        for r in self.rows(step, step):
            if r.get("group_id") == group_id and r.get("sample_id") == sample_id:
                found = r
        return found

    def group(self, step: int, group_id: int) -> list[dict[str, Any]]:
        rows = [r for r in self.rows(step, step) if r.get("group_id") == group_id]
        return sorted(rows, key=lambda r: r.get("sample_id") or 0)
