"""Where each step's lines are in a block file, found without parsing whole records.

A rollout block holds every rollout of ``rollout_block_size`` steps (hundreds of MB on a big
run). ``StepIndex`` follows one block file and keeps, per line, only its step, byte offset and
length (packed arrays: about 16 bytes a line); a query for one step then seeks to that step's
lines and parses only them. The step is read from the line's first bytes (records start with
``{"step": N`` in the order our writers use), falling back to a full parse for other layouts.

Resumed runs log some steps again. A step number going down within a block marks a new
*epoch* (a later process); a step's lines are those of the latest epoch that logged it, so the
later record wins.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from telescope.cli.ui.confine import open_run_file
from telescope.cli.ui.tail import READ_CHUNK, FileTail, parse_json_line

__all__ = ["StepIndex", "step_of"]

_STEP_AT_START = re.compile(rb'\{"step": (-?\d+)[,}]')
_STEP_ANYWHERE = re.compile(rb'"step": (-?\d+|null)[,}]')
#: Every line of a chunk whose first bytes hold ``"step": N`` (the fast path: one C-level scan).


def step_of(data: bytes, start: int = 0, end: int | None = None, *, head: int = 400) -> int | None:
    """The ``step`` of the JSONL line ``data[start:end]`` (None when it has none; ``-1`` when
    it is unreadable). Looks only at the line's first ``head`` bytes unless it must parse it."""
    end = len(data) if end is None else end
    match = _STEP_AT_START.match(data, start, end) or _STEP_ANYWHERE.search(
        data, start, min(end, start + head)
    )
    if match:
        return None if match.group(1) == b"null" else int(match.group(1))
    record = parse_json_line(data[start:end])
    if record is None:
        return -1
    step = record.get("step")
    return int(step) if isinstance(step, int) else None


@dataclass
class _Epochs:
    """Per step, the epoch of its latest lines; the epoch bumps when the step goes down."""

    current: int = 0
    last_step: int | None = None
    of_step: dict[int, int] = field(default_factory=dict)

    def see(self, step: int) -> int:
        if self.last_step is not None and step < self.last_step:
            self.current += 1
        self.last_step = step
        self.of_step[step] = self.current
        return self.current


class StepIndex:
    """Line offsets by step for one append-only JSONL file (see module doc).

    Args:
        path: the JSONL file.
        epochs: keep only the latest epoch's lines of a step (rollouts); events interleave
            steps (async generation) so they keep every line.

    Lines without a step (run marks) are indexed under ``NO_STEP``.
    """

    NO_STEP = -(2**31)

    def __init__(self, path: Path, *, epochs: bool = True) -> None:
        self.path = Path(path)
        self._tail = FileTail(self.path)
        self._use_epochs = epochs
        self.offsets = array("q")
        self.lengths = array("i")
        self._ranges: dict[int, list[list[int]]] = {}
        """step -> ``[[first line, last line + 1, epoch], ...]`` (runs of consecutive lines)."""
        self._epochs = _Epochs()
        self._last_step: int | None = None
        self.bad_lines = 0

    @property
    def torn_tail(self) -> bool:
        return self._tail.torn_tail

    def __len__(self) -> int:
        return len(self.offsets)

    def _clear(self) -> None:
        del self.offsets[:]
        del self.lengths[:]
        self._ranges = {}
        self._epochs = _Epochs()
        self._last_step = None
        self.bad_lines = 0

    def _add_run(self, step: int, offsets: list[int], lengths: list[int]) -> None:
        """Consecutive lines of one step."""
        epoch = self._epochs.see(step) if self._use_epochs and step != self.NO_STEP else 0
        i = len(self.offsets)
        self.offsets.extend(offsets)
        self.lengths.extend(lengths)
        runs = self._ranges.setdefault(step, [])
        if runs and step == self._last_step and runs[-1][1] == i and runs[-1][2] == epoch:
            runs[-1][1] = i + len(offsets)
        else:
            runs.append([i, i + len(offsets), epoch])
        self._last_step = step

    def _index_chunk(self, data: bytes, base: int) -> int:
        """Index the complete lines of ``data`` (which starts at file offset ``base``)."""
        starts: list[int] = []
        ends: list[int] = []
        steps: list[int] = []
        pos, size, find = 0, len(data), data.find
        while pos < size:
            nl = find(b"\n", pos)  # memchr: the long lines themselves are never copied
            if nl > pos:
                step = step_of(data, pos, nl)
                if step == -1 and parse_json_line(data[pos:nl]) is None:
                    self.bad_lines += 1
                else:
                    starts.append(pos)
                    ends.append(nl)
                    steps.append(self.NO_STEP if step is None else step)
            pos = nl + 1
        first = 0
        for i in range(1, len(steps) + 1):
            if i == len(steps) or steps[i] != steps[first]:
                self._add_run(
                    steps[first],
                    [base + x for x in starts[first:i]],
                    [e - x for x, e in zip(starts[first:i], ends[first:i], strict=True)],
                )
                first = i
        return len(steps)

    def refresh(self, max_chunks: int | None = None, chunk_bytes: int = READ_CHUNK) -> int:
        """Index the lines appended since the last call (at most ``max_chunks`` reads of
        ``chunk_bytes``; ``pending`` tells if more is left); returns how many were added."""
        added = 0
        chunks = 0
        while True:
            chunks += 1
            data, base, reset = self._tail.read_chunk(chunk_bytes)
            if reset:
                self._clear()
            added += self._index_chunk(data, base)
            if not data or not self._tail.pending() or (max_chunks is not None and chunks >= max_chunks):
                return added

    def pending(self) -> bool:
        """True when the file has bytes not indexed yet."""
        return self._tail.pending()

    def step_numbers(self) -> list[int]:
        """Steps with lines, ascending."""
        return sorted(s for s in self._ranges if s != self.NO_STEP)

    def count(self, step: int) -> int:
        return sum(b - a for a, b, _ in self._live_runs(step))

    def _live_runs(self, step: int) -> list[list[int]]:
        runs = self._ranges.get(step, [])
        if not self._use_epochs or not runs:
            return runs
        latest = max(r[2] for r in runs)
        return [r for r in runs if r[2] == latest]

    def spans(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """``(offset, length)`` of the live lines of steps ``lo..hi`` (inclusive), in file order."""
        idx = sorted(
            i
            for step in self._ranges
            if lo <= step <= hi and step != self.NO_STEP
            for a, b, _ in self._live_runs(step)
            for i in range(a, b)
        )
        return [(self.offsets[i], self.lengths[i]) for i in idx]

    def spans_without_step(self) -> list[tuple[int, int]]:
        return [
            (self.offsets[i], self.lengths[i])
            for a, b, _ in self._ranges.get(self.NO_STEP, [])
            for i in range(a, b)
        ]


def _line_at_or_after(f: BinaryIO, pos: int, size: int, head: int = 4096) -> tuple[int, int | None] | None:
    """``(start, step)`` of the first complete line starting at or after byte ``pos``; None at EOF."""
    if pos > 0:
        f.seek(pos - 1)
        skip = 0
        while True:  # find the end of the line that pos falls in
            chunk = f.read(head)
            if not chunk:
                return None
            nl = chunk.find(b"\n")
            if nl >= 0:
                pos = pos - 1 + skip + nl + 1
                break
            skip += len(chunk)
    if pos >= size:
        return None
    f.seek(pos)
    data = f.read(head)
    nl = data.find(b"\n")
    if nl < 0 and pos + len(data) >= size:
        return None  # a torn last line
    step = step_of(data, 0, nl if nl >= 0 else len(data))
    return pos, step


def bisect_step_spans(path: Path, step: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the lines of ``step`` in a file whose steps never go down (a rollout
    block written by one process), found by binary search: about 2 log2(lines) small reads,
    instead of scanning a block of hundreds of MB. Do not use it on a resumed run's blocks."""
    size = path.stat().st_size
    with open_run_file(path) as f:

        def first_at_least(target: int) -> int:
            lo, hi = 0, size  # invariant: every line starting before lo has a step < target
            while lo < hi:
                mid = (lo + hi) // 2
                found = _line_at_or_after(f, mid, size)
                if found is None or (found[1] is not None and found[1] >= target):
                    hi = mid
                else:
                    lo = found[0] + 1
            found = _line_at_or_after(f, lo, size)
            return size if found is None else found[0]

        start, end = first_at_least(step), first_at_least(step + 1)
        f.seek(start)
        data = f.read(end - start)
    spans, pos = [], 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # the rest is a torn last line
        if nl > pos and step_of(data, pos, nl) == step:
            spans.append((start + pos, nl - pos))
        pos = nl + 1
    return spans
