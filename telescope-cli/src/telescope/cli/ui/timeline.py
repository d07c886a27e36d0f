"""Timeline spans from the run's events: generation and reward per server lane, trainer steps,
weight syncs, evals and checkpoints, plus the trainer's phases drawn from its timing metrics.

Events are indexed by step (``StepIndex`` over every event block, schema 1's ``events.jsonl``
first); a query parses only the events of the steps asked for. A ``start`` and the next ``end``
with the same identifying fields form a span; a start with no end yet (a running or a killed
run) stays open up to the newest event seen. The runtime emits no per-phase trainer events
(docs/run-directory.md), so phases come from the step's ``timing_*_total`` metrics, laid end to
end inside the ``train_step`` span and marked ``derived``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from telescope.cli.ui.index import StepIndex
from telescope.core.observe.rundir.blocks import block_files
from telescope.core.observe.rundir.layout import EVENTS_DIR, EVENTS_FILE
from telescope.core.observe.rundir.tail import parse_json_line

__all__ = ["EventStore", "TRAINER_PHASES", "build_spans"]

#: Trainer phases drawn from step metrics, in the order a step runs them.
TRAINER_PHASES = (
    ("waiting_for_data", "timing_waiting_for_data"),
    ("prepare_tensors", "timing_prepare_tensors_total"),
    ("data_to_device", "timing_data_to_device_total"),
    ("forward", "timing_forward_total"),
    ("loss", "timing_loss_computation_total"),
    ("backward", "timing_backward_total"),
    ("weight_sync (trainer)", "timing_weight_sync_trainer_total"),
)
_ID_FIELDS = ("type", "name", "step", "group_id", "sample_id", "server", "lane", "rank")
_SAMPLE_ID_FIELDS = ("type", "group_id", "sample_id")


def lane_of(event: dict[str, Any]) -> str:
    """The Gantt row of an event: one per server lane for samples, one per kind otherwise."""
    kind = event.get("type")
    if kind in ("generation", "reward"):
        server, lane = event.get("server"), event.get("lane")
        if server is None and lane is None:
            return "samples"
        return f"server {server if server is not None else '?'} / lane {lane if lane is not None else '?'}"
    if kind == "trainer":
        rank = event.get("rank")
        return "trainer" if rank is None else f"trainer rank {rank}"
    if kind == "sandbox":  # one row per sandbox: its life (create, uploads, commands, destroy) in order
        sandbox = (event.get("attrs") or {}).get("sandbox_id")
        return "sandbox" if sandbox is None else f"sandbox {sandbox}"
    return {"weight_sync": "weight sync", "eval": "evals", "checkpoint": "checkpoints"}.get(
        str(kind), str(kind)
    )


def _pair_key(event: dict[str, Any]) -> tuple[Any, ...]:
    # A sample's generation can start while one step is being filled and end in the next (its
    # end event carries the later step), so sample spans pair on the sample's ids, not the step.
    fields = _SAMPLE_ID_FIELDS if event.get("type") in ("generation", "reward") else _ID_FIELDS
    key = tuple(event.get(f) for f in fields)
    if event.get("type") == "sandbox":  # sandboxes work at once; each one's calls come one by one
        key += ((event.get("attrs") or {}).get("sandbox_id"),)
    return key


def build_spans(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(spans, instants)`` from events (see module doc); an ``end`` with no ``start`` is dropped."""
    open_: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    spans: list[dict[str, Any]] = []
    instants: list[dict[str, Any]] = []
    newest = max((float(e.get("time") or 0.0) for e in events), default=0.0)
    for event in sorted(events, key=lambda e: float(e.get("time") or 0.0)):
        key = _pair_key(event)
        phase = event.get("phase")
        if phase == "start":
            open_.setdefault(key, []).append(event)
        elif phase == "end":
            if open_.get(key):
                spans.append(_span(open_[key].pop(), event, newest))
        else:
            instants.append({**_fields(event), "row": lane_of(event), "time": event.get("time")})
    for starts in open_.values():
        spans.extend(_span(s, None, newest) for s in starts)
    _reward_rows(spans)
    spans.sort(key=lambda s: s["start"])
    return spans, instants


def _reward_rows(spans: list[dict[str, Any]]) -> None:
    """Reward events carry no server/lane: draw each on its sample's generation row."""
    rows = {(s["group_id"], s["sample_id"]): s["row"] for s in spans if s["type"] == "generation"}
    for span in spans:
        if span["type"] == "reward" and span["row"] == "samples":
            span["row"] = rows.get((span["group_id"], span["sample_id"]), "samples")


def _fields(event: dict[str, Any]) -> dict[str, Any]:
    return {
        k: event.get(k)
        for k in ("type", "name", "step", "group_id", "sample_id", "server", "lane", "rank", "attrs")
    }


def _span(start: dict[str, Any], end: dict[str, Any] | None, newest: float) -> dict[str, Any]:
    t0 = float(start.get("time") or 0.0)
    t1 = float(end.get("time") or 0.0) if end is not None else newest
    out = _fields(start)
    out.update(
        row=lane_of(start),
        start=t0,
        end=max(t1, t0),
        open=end is None,
        end_step=end.get("step") if end is not None else None,
        attrs={**(start.get("attrs") or {}), **((end or {}).get("attrs") or {})},
    )
    return out


def trainer_phases(spans: list[dict[str, Any]], metrics_of: Any) -> list[dict[str, Any]]:
    """Derived phase spans inside each ``train_step`` span, from ``metrics_of(step)``.

    The phases are laid end to end from the span's start; when their seconds add up to more
    than the span (summed micro-batch timings, a wait timed before the span started), they are
    scaled down together to fit inside it (``attrs.scale`` < 1), so no phase overruns its step.
    """
    out = []
    for span in spans:
        if span["type"] != "trainer" or span["name"] != "train_step" or span["step"] is None:
            continue
        metrics = metrics_of(int(span["step"])) or {}
        phases = [
            (name, key, float(v))
            for name, key in TRAINER_PHASES
            if isinstance(v := metrics.get(key), int | float) and v > 0
        ]
        total = sum(seconds for _, _, seconds in phases)
        length = span["end"] - span["start"]
        scale = min(1.0, length / total) if total > 0 else 1.0
        t = span["start"]
        for name, key, seconds in phases:
            drawn = seconds * scale
            out.append(
                {
                    "type": "trainer_phase",
                    "name": name,
                    "step": span["step"],
                    "row": "trainer phases",
                    "start": t,
                    "end": min(t + drawn, span["end"]),
                    "open": False,
                    "derived": True,
                    "attrs": {"metric": key, "seconds": seconds, "scale": scale},
                }
            )
            t += drawn
    return out


class EventStore:
    """Every event file of one run, indexed by step.

    Args:
        origin, block_s: the run's ``created_at`` and ``event_block_duration_seconds`` (schema 2):
            block ``k`` holds the events written in ``[origin + k*block_s, origin + (k+1)*block_s)``,
            so a query with a time window reads only the blocks it overlaps.
    """

    def __init__(self, run_dir: Path, origin: float | None = None, block_s: float | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.origin, self.block_s = origin, block_s
        self._indexes: dict[Path, StepIndex] = {}

    def _files(self, window: tuple[float, float] | None = None) -> list[Path]:
        legacy = self.run_dir / EVENTS_FILE
        blocks = block_files(self.run_dir / EVENTS_DIR)
        if window is not None and self.origin is not None and self.block_s:
            first = int((window[0] - self.origin) // self.block_s) if math.isfinite(window[0]) else 0
            last = int((window[1] - self.origin) // self.block_s) if math.isfinite(window[1]) else 2**62
            blocks = [(k, p) for k, p in blocks if first <= k <= last]
        return ([legacy] if legacy.exists() else []) + [p for _, p in blocks]

    def all_indexes(self, window: tuple[float, float] | None = None) -> list[StepIndex]:
        """An index per event file (of the blocks overlapping ``window``); not refreshed."""
        files = self._files(window)
        for path in files:
            if path not in self._indexes:
                self._indexes[path] = StepIndex(path, epochs=False)
        return [self._indexes[p] for p in files]

    def _refresh(self, window: tuple[float, float] | None = None) -> list[StepIndex]:
        indexes = self.all_indexes(window)
        for index in indexes:
            index.refresh()
        return indexes

    def steps(self) -> list[int]:
        return sorted({s for index in self._refresh() for s in index.step_numbers()})

    def count(self) -> int:
        return sum(len(index) for index in self._refresh())

    def events(self, lo: int, hi: int, window: tuple[float, float] | None = None) -> list[dict[str, Any]]:
        """Events of steps lo..hi (inclusive), from the blocks overlapping ``window`` (unix times)."""
        return self._read(lambda index: index.spans(lo, hi), window)

    def unstepped_events(self, window: tuple[float, float] | None = None) -> list[dict[str, Any]]:
        """Events with no step (run lifecycle marks)."""
        return self._read(lambda index: index.spans_without_step(), window)

    def _read(
        self, spans_of: Callable[[StepIndex], list[tuple[int, int]]], window: tuple[float, float] | None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for index in self._refresh(window):
            spans = spans_of(index)
            if spans:
                out.extend(r for r in map(parse_json_line, index.read_at(spans)) if r is not None)
        return out
