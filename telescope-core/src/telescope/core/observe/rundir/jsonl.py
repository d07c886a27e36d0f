"""Append-only JSONL files that survive a killed writer, plain or zstd-framed.

Each record is one JSON line (``encode_line``: orjson). ``JsonlWriter`` appends the lines of one call with a
single ``write`` and flushes them to the OS at once, so a SIGKILL loses at most the line being
written. ``ZstdJsonlWriter`` (``*.jsonl.zst``) appends them the same way as complete zstd frames
(``telescope.core.observe.rundir.frames``): a SIGKILL loses at most the frame being written. The
OS keeps flushed data when the process dies; only a machine crash needs ``fsync``
(``sync=True``). ``iter_jsonl`` reads either kind (by suffix): it skips a torn end and counts
malformed lines and skipped frames instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from telescope.core.observe.rundir.frames import BLOCK_LEVEL, compress_lines
from telescope.core.observe.rundir.storage import StorageError, describe_os_error
from telescope.core.observe.rundir.tail import open_tail, split_lines

__all__ = ["JsonlReadStats", "JsonlWriter", "ZstdJsonlWriter", "iter_jsonl", "read_jsonl"]


def _jsonable(value: Any) -> Any:
    """The encoders' fallback for other types: arrays as lists, numpy scalars as numbers, the rest as str."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _clean(value: Any) -> Any:
    """Replace non-finite floats with None so every line is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


_ORJSON_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


def encode_line(record: Any) -> bytes:
    """One strict-JSON line, UTF-8, ending in ``\\n``, of a dict or a dataclass record (its fields).

    orjson writes it ~20x faster than ``json.dumps`` (a driver writes several events and one
    rollout per sample: ``bench/scale.py``) and writes NaN/inf as null, as ``_clean`` does. What
    orjson refuses (an int beyond 64 bits) is written by ``json`` after the cleaning pass.
    """
    try:
        return orjson.dumps(record, default=_jsonable, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        is_record = dataclasses.is_dataclass(record) and not isinstance(record, type)
        plain = dataclasses.asdict(record) if is_record else record
        return (json.dumps(_clean(plain), default=_jsonable, ensure_ascii=False) + "\n").encode("utf-8")


class JsonlWriter:
    """Thread-safe appender to one JSONL file (created with its parent folders)."""

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sync = sync
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # kept open for appends
        self._repair_torn_tail()

    def _repair_torn_tail(self) -> None:
        """On reopen after a crash, start on a fresh line so the torn line stays alone."""
        size = self.path.stat().st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                self._file.write(b"\n")
                self._file.flush()

    def _encode_lines(self, lines: list[bytes]) -> bytes:
        return b"".join(lines)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line and flush it."""
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append records, one line each, in one write and one flush (a kill tears at most the last)."""
        if not records:
            return
        self.write_lines([encode_line(r) for r in records])

    def write_lines(self, lines: list[bytes]) -> None:
        """Append already encoded lines (each ending in ``\\n``) in one write and one flush."""
        if not lines:
            return
        text = self._encode_lines(lines)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"JSONL file {self.path} is closed: the logger already finished")
            try:
                self._file.write(text)
                self._file.flush()
                if self._sync:
                    os.fsync(self._file.fileno())
            except OSError as exc:
                raise StorageError(f"{self.path} could not be written: {describe_os_error(exc)}") from exc

    def close(self) -> None:
        """Close the file; what a failed write left in the buffer is dropped (``close`` still closes
        the descriptor when its final flush fails)."""
        with self._lock:
            if not self._file.closed:
                with contextlib.suppress(OSError):
                    self._file.close()


class ZstdJsonlWriter(JsonlWriter):
    """``JsonlWriter`` for ``*.jsonl.zst``: each call appends complete zstd frames of whole lines.

    A writer killed mid-append leaves a torn frame; reopening appends after it (readers skip it
    and count it, as they count a torn line of a plain file), so nothing before it is touched.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False, level: int = BLOCK_LEVEL) -> None:
        self._level = level
        super().__init__(path, sync=sync)

    def _repair_torn_tail(self) -> None:
        """Nothing to do: a torn frame is skipped by readers up to the next complete frame."""

    def _encode_lines(self, lines: list[bytes]) -> bytes:
        return compress_lines(lines, self._level)


class JsonlReadStats:
    """What a read skipped: ``torn_tail`` (an unfinished end: a torn line or frame), ``bad_lines``
    (malformed lines) and, in a compressed file, ``skipped_frames`` (torn or corrupt frames
    followed by good ones, ``skipped_bytes`` long in all)."""

    def __init__(self) -> None:
        self.records = 0
        self.torn_tail = False
        self.bad_lines = 0
        self.skipped_frames = 0
        self.skipped_bytes = 0

    def problems(self) -> str:
        """What was skipped, in words (``""`` when nothing was)."""
        parts = []
        if self.skipped_frames:
            parts.append(
                f"{self.skipped_frames} torn or corrupt compressed frame(s) skipped ({self.skipped_bytes} bytes)"
            )
        if self.bad_lines:
            parts.append(f"{self.bad_lines} malformed line(s) skipped")
        if self.torn_tail:
            parts.append("an unfinished end ignored (torn by a killed writer, or being written)")
        return "; ".join(parts)


def iter_jsonl(path: str | os.PathLike[str], stats: JsonlReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield every complete record of ``path`` (``*.zst``: zstd-framed); a missing file yields nothing."""
    stats = stats if stats is not None else JsonlReadStats()
    tail = open_tail(Path(path))
    while True:
        data, base, _ = tail.read_chunk()
        stats.torn_tail = tail.torn_tail
        stats.skipped_frames, stats.skipped_bytes = tail.skipped_frames, tail.skipped_bytes
        if not data:
            return
        for line in split_lines(data, base):
            if not line.data.strip():
                continue
            try:
                record = json.loads(line.data.decode("utf-8", errors="replace"))
            except json.JSONDecodeError:
                stats.bad_lines += 1
                continue
            if not isinstance(record, dict):
                stats.bad_lines += 1
                continue
            stats.records += 1
            yield record


def read_jsonl(path: str | os.PathLike[str], stats: JsonlReadStats | None = None) -> list[dict[str, Any]]:
    """All complete records of ``path`` (see ``iter_jsonl``)."""
    return list(iter_jsonl(path, stats))
