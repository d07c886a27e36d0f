"""Block files of the run directory: events by time (with a tail window), rollouts by step.

Blocks are zstd-framed JSONL (``block_{k}.jsonl.zst``, ``telescope.core.observe.rundir.frames``);
schema 2 wrote them as plain ``block_{k}.jsonl``, which ``block_files`` still lists (a plain and a
compressed file of one index, from a run resumed by a newer Telescope: the plain one first).

``EventBlocks`` buffers events and appends them as one frame to ``events/block_{k}.jsonl.zst``
when ``flush`` is called (every tick of the hub), when the buffer holds ``FRAME_MAX_BYTES`` or
its oldest event is ``EVENT_FLUSH_SECONDS`` old at the next write, and when the block changes;
``k`` counts ``event_block_duration_seconds`` windows since the run was created (so a resume
continues the numbering). It keeps the events of the last ``event_tail_window_seconds`` in
memory to rewrite ``events/tail.jsonl.zst`` (atomically) when asked, at most ``TAIL_MAX_BYTES`` of
them (oldest dropped first): a driver writing thousands of events a second keeps a bounded tail, and
every event stays in its block. ``StepBlocks`` appends each
step's rollouts as one frame (or more, past ``FRAME_MAX_BYTES``) to
``rollouts/block_{k}.jsonl.zst`` with ``k = step // rollout_block_size``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from telescope.core.observe.rundir.frames import FRAME_MAX_BYTES, compress_lines
from telescope.core.observe.rundir.jsonl import JsonlWriter, ZstdJsonlWriter, encode_line
from telescope.core.observe.rundir.layout import EVENTS_TAIL_FILE, LEGACY_EVENTS_TAIL_FILE

__all__ = [
    "BLOCK_PATTERN",
    "EVENT_FLUSH_SECONDS",
    "EventBlocks",
    "StepBlocks",
    "block_files",
    "block_index",
    "block_name",
]

#: A block file, compressed (schema 3) or plain (schema 2).
BLOCK_PATTERN = re.compile(r"^block_(\d+)\.jsonl(\.zst)?$")
#: Buffered events are appended at the next write once the oldest is this old (the hub's tick,
#: at most every 0.5 s, appends them sooner); a killed run loses at most these events.
EVENT_FLUSH_SECONDS = 1.0


def block_name(index: int) -> str:
    """``block_000012.jsonl.zst`` (zero-padded so a plain listing is in order)."""
    return f"block_{index:06d}.jsonl.zst"


def block_index(path: Path) -> int | None:
    """The index of a block file's name (compressed or plain), None for any other file."""
    match = BLOCK_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else None


def block_files(folder: Path) -> list[tuple[int, Path]]:
    """``[(index, path)]`` of the block files in ``folder``, by index (a plain file before the
    compressed one of the same index: it was written first); ``[]`` if it is missing."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        index = block_index(path)
        if index is not None:
            found.append((index, path))
    return sorted(found, key=lambda item: (item[0], item[1].name.endswith(".zst")))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` through a temp file and a rename (readers never see half)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
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
            self._writer = ZstdJsonlWriter(self.folder / block_name(index))
            self.index = index
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


TAIL_MAX_BYTES = 16 * 2**20
"""Most bytes of JSON the events tail holds in memory (the window is cut shorter past it)."""


class EventBlocks:
    """Timeline events into time blocks plus a rewritable tail window (see module doc)."""

    def __init__(
        self,
        folder: Path,
        *,
        origin: float,
        block_duration_s: float,
        tail_window_s: float,
        tail_max_bytes: int = TAIL_MAX_BYTES,
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
        self.tail_max_bytes = int(tail_max_bytes)
        self._tail: deque[tuple[float, bytes]] = deque()
        self._tail_bytes = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_index = 0
        self._pending_since = 0.0
        self._lock = threading.Lock()
        # schema 2's plain tail: stale once this run writes its own
        (self.folder / Path(LEGACY_EVENTS_TAIL_FILE).name).unlink(missing_ok=True)

    def current_index(self, now: float) -> int:
        """Block of a write at ``now``; never goes back when the clock does."""
        index = max(int((now - self.origin) // self.block_duration_s), 0)
        return max(index, self._blocks.index or 0, self._pending_index)

    def write(self, records: Sequence[Any]) -> None:
        """Buffer ``records`` (dicts or dataclass records such as ``TimelineEvent``) for their block."""
        if not records:
            return
        with self._lock:
            now = self._clock()
            index = self.current_index(now)
            if self._pending and index != self._pending_index:
                self._flush()  # the events of a block never go to the next one
            if not self._pending:
                self._pending_index, self._pending_since = index, now
            lines = [encode_line(r) for r in records]
            self._pending.extend(lines)
            self._pending_bytes += sum(len(line) for line in lines)
            self._tail.extend((now, line) for line in lines)
            self._tail_bytes += sum(len(line) for line in lines)
            self._prune(now)
            if self._pending_bytes >= FRAME_MAX_BYTES or now - self._pending_since >= EVENT_FLUSH_SECONDS:
                self._flush()

    def flush(self) -> None:
        """Append the buffered events to their block (one frame)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        self._blocks.writer_for(self._pending_index).write_lines(lines)

    def _prune(self, now: float) -> None:
        oldest = now - self.tail_window_s
        while self._tail and (self._tail[0][0] < oldest or self._tail_bytes > self.tail_max_bytes):
            self._tail_bytes -= len(self._tail.popleft()[1])

    def write_tail(self) -> int:
        """Rewrite ``tail.jsonl.zst`` with the events written in the last window; returns their count."""
        with self._lock:
            self._prune(self._clock())
            lines = [line for _, line in self._tail]
        write_bytes_atomic(self.folder / Path(EVENTS_TAIL_FILE).name, compress_lines(lines))
        return len(lines)

    def close(self) -> None:
        with self._lock:
            try:
                self._flush()
            finally:
                self._blocks.close()


class StepBlocks:
    """Records into ``block_{step // block_size}.jsonl.zst``; records of one call share a step."""

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
