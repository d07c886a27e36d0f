"""Block files of the run directory: events by time (with a tail window), rollouts by step.

``EventBlocks`` appends each event at once to ``events/block_{k}.jsonl``, where ``k`` counts
``event_block_duration_seconds`` windows since the run was created (so a resume continues
the numbering), and keeps the events of the last ``event_tail_window_seconds`` in memory to
rewrite ``events/tail.jsonl`` (atomically) when asked. ``StepBlocks`` appends each rollout to
``rollouts/block_{k}.jsonl`` with ``k = step // rollout_block_size``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from telescope.core.observe.rundir.jsonl import JsonlWriter, _dumps

__all__ = ["BLOCK_PATTERN", "EventBlocks", "StepBlocks", "block_files", "block_name"]

BLOCK_PATTERN = re.compile(r"^block_(\d+)\.jsonl$")


def block_name(index: int) -> str:
    """``block_000012.jsonl`` (zero-padded so a plain listing is in order)."""
    return f"block_{index:06d}.jsonl"


def block_files(folder: Path) -> list[tuple[int, Path]]:
    """``[(index, path)]`` of the block files in ``folder``, by index; ``[]`` if it is missing."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = BLOCK_PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temp file and a rename (readers never see half)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
    os.replace(tmp, path)


class _RotatingWriter:
    """One open ``JsonlWriter`` at a time, switched when the block index changes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.index: int | None = None
        self._writer: JsonlWriter | None = None

    def writer_for(self, index: int) -> JsonlWriter:
        if index != self.index or self._writer is None:
            if self._writer is not None:
                self._writer.close()
            self._writer = JsonlWriter(self.folder / block_name(index))
            self.index = index
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EventBlocks:
    """Timeline events into time blocks plus a rewritable tail window (see module doc)."""

    def __init__(
        self,
        folder: Path,
        *,
        origin: float,
        block_duration_s: float,
        tail_window_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if block_duration_s <= 0 or tail_window_s <= 0:
            raise ValueError(
                f"event blocks need positive durations: block {block_duration_s!r} s, tail {tail_window_s!r} s"
            )
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.origin = float(origin)
        self.block_duration_s = float(block_duration_s)
        self.tail_window_s = float(tail_window_s)
        self._clock = clock
        self._blocks = _RotatingWriter(folder)
        self._tail: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()

    def current_index(self, now: float) -> int:
        """Block of a write at ``now``; never goes back when the clock does."""
        index = max(int((now - self.origin) // self.block_duration_s), 0)
        return max(index, self._blocks.index or 0)

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        with self._lock:
            now = self._clock()
            self._blocks.writer_for(self.current_index(now)).write_many(records)
            self._tail.extend((now, _dumps(r)) for r in records)
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._tail and self._tail[0][0] < now - self.tail_window_s:
            self._tail.popleft()

    def write_tail(self) -> int:
        """Rewrite ``tail.jsonl`` with the events written in the last window; returns their count."""
        with self._lock:
            self._prune(self._clock())
            lines = [line for _, line in self._tail]
        write_text_atomic(self.folder / "tail.jsonl", "".join(lines))
        return len(lines)

    def close(self) -> None:
        with self._lock:
            self._blocks.close()


class StepBlocks:
    """Records into ``block_{step // block_size}.jsonl``; records of one call share a step."""

    def __init__(self, folder: Path, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"rollout_block_size {block_size!r} must be >= 1 step")
        self.block_size = int(block_size)
        self._blocks = _RotatingWriter(folder)
        self._lock = threading.Lock()

    def write(self, step: int, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        with self._lock:
            self._blocks.writer_for(max(int(step), 0) // self.block_size).write_many(records)

    def close(self) -> None:
        with self._lock:
            self._blocks.close()
