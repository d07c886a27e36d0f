"""Incremental readers of append-only files: read only the bytes appended since the last call.

A run directory's JSONL and log files only grow (docs/run-directory.md). ``FileTail`` keeps
the byte offset of the first unread line and, on ``read_lines``, returns the complete lines
appended since, each with its offset. A torn last line (no newline yet: the writer is mid-line
or died there) is left unread and retried next time. A file that shrank or was replaced
(``events/tail.jsonl`` is rewritten by rename) is read again from the start, and the caller is
told so through ``reset``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.cli.ui.confine import OutsideRunDir, open_run_file

__all__ = ["FileTail", "Line", "parse_json_line"]

#: Upper bound of bytes read per ``read_lines`` call, so one request never reads a whole huge file.
READ_CHUNK = 16 * 1024 * 1024


@dataclass(frozen=True)
class Line:
    """One complete line: its start offset in the file and its bytes (newline stripped)."""

    offset: int
    data: bytes


class FileTail:
    """Byte-offset follower of one file (see module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.torn_tail = False
        """True while the file ends in an unfinished line."""
        self.resets = 0
        """How often the file was found shrunk or replaced and read again from the start."""
        self._ino: int | None = None
        self.refused = ""
        """Why the file is not read (it resolves outside its run directory), or empty."""

    def _check_replaced(self, st: os.stat_result) -> bool:
        replaced = self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset)
        self._ino = st.st_ino
        if replaced:
            self.offset = 0
            self.resets += 1
        return replaced

    def read_chunk(self, limit: int = READ_CHUNK) -> tuple[bytes, int, bool]:
        """``(bytes of complete new lines, their start offset, reset)``; at most ``limit`` bytes."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return b"", self.offset, False
        reset = self._check_replaced(st)
        if st.st_size == self.offset:
            self.torn_tail = False
            return b"", self.offset, reset
        remaining = st.st_size - self.offset
        try:
            f = open_run_file(self.path)
        except OutsideRunDir as exc:  # a symlink out of the run: never read (nothing pending either)
            self.refused = str(exc)
            return b"", self.offset, False
        with f:
            f.seek(self.offset)
            chunks = [f.read(min(remaining, limit))]
            size = len(chunks[0])
            # a line longer than limit: read on to its end, searching only the bytes just read and
            # joining once (searching and growing the whole buffer each time was quadratic)
            while chunks[-1] and b"\n" not in chunks[-1] and size < remaining:
                chunks.append(f.read(min(remaining - size, limit)))
                size += len(chunks[-1])
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        end = data.rfind(b"\n")
        self.torn_tail = end < len(data) - 1 and self.offset + len(data) == st.st_size
        base = self.offset
        if end < 0:
            return b"", base, reset
        self.offset += end + 1
        return data[: end + 1] if end + 1 < len(data) else data, base, reset

    def read_lines(self, limit: int = READ_CHUNK) -> tuple[list[Line], bool]:
        """``(new complete lines, reset)``; ``reset`` is True when reading restarted at byte 0."""
        data, base, reset = self.read_chunk(limit)
        return list(_split(data, base)), reset

    def pending(self) -> bool:
        """True when the file holds bytes past the offset (more to read, or a torn line)."""
        if self.refused:
            return False
        try:
            return self.path.stat().st_size > self.offset
        except FileNotFoundError:
            return False


def _split(data: bytes, base: int) -> Iterator[Line]:
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        if nl > pos:
            yield Line(base + pos, data[pos:nl])
        pos = nl + 1


def parse_json_line(data: bytes) -> dict[str, Any] | None:
    """The JSON object on one line, or None when it is malformed (counted by callers)."""
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def read_at(path: Path, spans: list[tuple[int, int]]) -> list[bytes]:
    """The bytes at ``(offset, length)`` spans of ``path`` (one open, seeks in offset order)."""
    out: dict[int, bytes] = {}
    with open_run_file(path) as f:
        for offset, length in sorted(set(spans)):
            f.seek(offset)
            out[offset] = f.read(length)
    return [out[o] for o, _ in spans]
