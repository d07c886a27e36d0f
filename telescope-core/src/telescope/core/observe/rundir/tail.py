"""Incremental readers of the run directory's record files: only what was appended since the last call.

A run directory's record files only grow (docs/run-directory.md). ``open_tail(path)`` follows one:
``FileTail`` for plain JSONL and logs, ``FrameTail`` for zstd-framed JSONL (``*.jsonl.zst``,
``telescope.core.observe.rundir.frames``). Both hand out the file's *content*: complete lines,
each with its content offset (for a plain file the byte offset; for a compressed one the offset
in the decompressed stream), and ``read_at`` reads lines back by those offsets. An unfinished
end (a torn line, a torn frame: the writer is mid-write or died there) is left unread and retried
next time. A file that shrank or was replaced (``events/tail.jsonl.zst`` is rewritten by rename)
is read again from the start, and the caller is told so through ``reset``. A compressed file's
torn or corrupt frames followed by good ones are skipped and counted (``skipped_frames``).

Every read opens the file through ``opener`` (default ``open(path, "rb")``): the dashboard passes
one that refuses a file resolving outside its run directory by raising ``ValueError``; such a
file is never read and never pending, and ``refused`` says why.
"""

from __future__ import annotations

import bisect
import json
import os
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from telescope.core.observe.rundir.frames import ZSTD_SUFFIX, decode_frame, decode_frames

__all__ = [
    "READ_CHUNK",
    "FileTail",
    "FrameTail",
    "Line",
    "Opener",
    "open_tail",
    "parse_json_line",
    "split_lines",
]

#: Upper bound of bytes read per ``read_lines`` call, so one request never reads a whole huge file.
READ_CHUNK = 16 * 1024 * 1024

#: Opens a record file for reading; raises ``ValueError`` to refuse it (see module doc).
Opener = Callable[[Path], BinaryIO]


def _open_binary(path: Path) -> BinaryIO:
    return open(path, "rb")


@dataclass(frozen=True)
class Line:
    """One complete line: its start offset in the file's content and its bytes (newline stripped)."""

    offset: int
    data: bytes


class FileTail:
    """Byte-offset follower of one plain file (see module doc)."""

    compressed = False

    def __init__(self, path: Path, opener: Opener | None = None) -> None:
        self.path = Path(path)
        self._opener = opener or _open_binary
        self.refused = ""
        """Why the file is not read (the opener refused it), or empty."""
        self.offset = 0
        self.torn_tail = False
        """True while the file ends in an unfinished line."""
        self.resets = 0
        """How often the file was found shrunk or replaced and read again from the start."""
        self.skipped_frames = 0
        self.skipped_bytes = 0
        self._ino: int | None = None

    def _check_replaced(self, st: os.stat_result, position: int) -> bool:
        replaced = self._ino is not None and (st.st_ino != self._ino or st.st_size < position)
        self._ino = st.st_ino
        if replaced:
            self._restart()
            self.resets += 1
        return replaced

    def _restart(self) -> None:
        self.offset = 0

    def _open(self) -> BinaryIO | None:
        """The file opened for reading, None when the opener refuses it (``refused`` says why)."""
        try:
            return self._opener(self.path)
        except ValueError as exc:
            self.refused = str(exc)
            return None

    def read_chunk(self, limit: int = READ_CHUNK) -> tuple[bytes, int, bool]:
        """``(bytes of complete new lines, their start offset, reset)``; at most ``limit`` bytes."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return b"", self.offset, False
        reset = self._check_replaced(st, self.offset)
        if st.st_size == self.offset:
            self.torn_tail = False
            return b"", self.offset, reset
        remaining = st.st_size - self.offset
        f = self._open()
        if f is None:
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
        """``(new complete lines, reset)``; ``reset`` is True when reading restarted at offset 0."""
        data, base, reset = self.read_chunk(limit)
        return list(split_lines(data, base)), reset

    @property
    def file_position(self) -> int:
        """The byte offset in the file of the next unread data (a plain file: ``offset``)."""
        return self.offset

    def pending(self) -> bool:
        """True when the file holds bytes past the read position (more to read, or a torn end)."""
        if self.refused:
            return False
        try:
            return self.path.stat().st_size > self.file_position
        except FileNotFoundError:
            return False

    def read_at(self, spans: list[tuple[int, int]]) -> list[bytes]:
        """The bytes at ``(offset, length)`` spans (one open, seeks in offset order)."""
        out: dict[int, bytes] = {}
        f = self._open()
        if f is None:
            raise ValueError(self.refused)
        with f:
            for offset, length in sorted(set(spans)):
                f.seek(offset)
                out[offset] = f.read(length)
        return [out[o] for o, _ in spans]


class FrameTail(FileTail):
    """Follower of a zstd-framed JSONL file (see module doc).

    ``offset`` is the content offset of the next unread line; ``file_offset`` the byte offset of
    the next unread frame. The frames read so far are kept as ``(content start, file offset,
    length)`` so ``read_at`` decompresses only the frames holding the lines asked for.
    """

    compressed = True
    #: Decompressed frames kept for ``read_at`` (a step's lines usually sit in one or two).
    CACHE_FRAMES = 8

    def __init__(self, path: Path, opener: Opener | None = None) -> None:
        super().__init__(path, opener)
        self.file_offset = 0
        self._content_starts = array("q")
        self._file_offsets = array("q")
        self._file_lengths = array("q")
        self._cache: OrderedDict[int, bytes] = OrderedDict()

    def _restart(self) -> None:
        self.offset = self.file_offset = 0
        del self._content_starts[:], self._file_offsets[:], self._file_lengths[:]
        self._cache.clear()

    def read_chunk(self, limit: int = READ_CHUNK) -> tuple[bytes, int, bool]:
        """``(content of the complete new frames, its start offset, reset)``: about ``limit`` bytes
        of content (a frame is never split)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return b"", self.offset, False
        reset = self._check_replaced(st, self.file_offset)
        remaining = st.st_size - self.file_offset
        if remaining <= 0:
            self.torn_tail = False
            return b"", self.offset, reset
        # JSONL compresses about 10x: read an eighth of ``limit``, more when no whole frame is in it
        want = min(remaining, max(limit // 8, 64 * 1024))
        f = self._open()
        if f is None:
            return b"", self.offset, False
        with f:
            while True:
                f.seek(self.file_offset)
                data = f.read(want)
                scan = decode_frames(data, max_content=limit)
                if scan.frames or len(data) >= remaining or len(data) < want:
                    break
                want = min(remaining, want * 4)  # not one whole frame in the bytes read: read more
        at_eof = self.file_offset + len(data) >= st.st_size
        base = self.offset
        contents = []
        for start, length, content in scan.frames:
            self._content_starts.append(self.offset)
            self._file_offsets.append(self.file_offset + start)
            self._file_lengths.append(length)
            contents.append(content)
            self.offset += len(content)
        self.skipped_frames += scan.skipped
        self.skipped_bytes += scan.skipped_bytes
        self.file_offset += scan.end
        self.torn_tail = scan.incomplete and at_eof
        return b"".join(contents), base, reset

    @property
    def file_position(self) -> int:
        return self.file_offset

    def _frame(self, i: int) -> bytes:
        content = self._cache.get(i)
        if content is not None:
            self._cache.move_to_end(i)
            return content
        f = self._open()
        if f is None:
            raise ValueError(self.refused)
        with f:
            f.seek(self._file_offsets[i])
            data = f.read(self._file_lengths[i])
        found = decode_frame(data)
        if found is None:
            raise ValueError(
                f"{self.path}: frame at byte {self._file_offsets[i]} is cut short (file replaced?)"
            )
        content = found[0] if found[0].endswith(b"\n") or not found[0] else found[0] + b"\n"
        self._cache[i] = content
        if len(self._cache) > self.CACHE_FRAMES:
            self._cache.popitem(last=False)
        return content

    def read_at(self, spans: list[tuple[int, int]]) -> list[bytes]:
        """The content bytes at ``(offset, length)`` spans of lines already read."""
        out = []
        for offset, length in spans:
            i = bisect.bisect_right(self._content_starts, offset) - 1
            if i < 0:
                raise ValueError(f"{self.path}: content offset {offset} was not read yet")
            at = offset - self._content_starts[i]
            out.append(self._frame(i)[at : at + length])
        return out


def open_tail(path: Path, opener: Opener | None = None) -> FileTail:
    """A ``FrameTail`` for ``*.zst``, else a ``FileTail`` (same interface: ``FrameTail`` is one)."""
    path = Path(path)
    return FrameTail(path, opener) if path.name.endswith(ZSTD_SUFFIX) else FileTail(path, opener)


def split_lines(data: bytes, base: int) -> Iterator[Line]:
    """The non-empty lines of ``data`` (complete lines, starting at content offset ``base``)."""
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
