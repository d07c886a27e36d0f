"""Append-only JSONL files that survive a killed writer.

Each record is one ``json.dumps`` line written with a single ``write`` call and flushed to
the OS at once, so a SIGKILL loses at most the line being written. The OS keeps flushed
data when the process dies; only a machine crash needs ``fsync`` (``sync=True``). The
reader skips a torn last line (and counts any malformed line) instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from telescope.core.observe.rundir.storage import StorageError, describe_os_error

__all__ = ["JsonlReadStats", "JsonlWriter", "iter_jsonl", "read_jsonl"]


def _jsonable(value: Any) -> Any:
    """Fallback for json.dumps: NaN/inf are written as null by ``_clean``; others as str."""
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


def _dumps(record: dict[str, Any]) -> str:
    """One strict-JSON line; the slow NaN-cleaning pass runs only when a non-finite float is present."""
    try:
        return json.dumps(record, default=_jsonable, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        return json.dumps(_clean(record), default=_jsonable, ensure_ascii=False) + "\n"


class JsonlWriter:
    """Thread-safe appender to one JSONL file (created with its parent folders)."""

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sync = sync
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # kept open for appends
        self._repair_torn_tail()

    def _repair_torn_tail(self) -> None:
        """On reopen after a crash, start on a fresh line so the torn line stays alone."""
        size = self.path.stat().st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                self._file.write("\n")
                self._file.flush()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line and flush it."""
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append records, one line each, in one write and one flush (a kill tears at most the last)."""
        if not records:
            return
        text = "".join(_dumps(r) for r in records)
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


class JsonlReadStats:
    """What a read skipped: ``torn_tail`` (an unfinished last line) and ``bad_lines``."""

    def __init__(self) -> None:
        self.records = 0
        self.torn_tail = False
        self.bad_lines = 0


def iter_jsonl(path: str | os.PathLike[str], stats: JsonlReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield every complete record of ``path``; a missing file yields nothing."""
    stats = stats if stats is not None else JsonlReadStats()
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if not line.endswith("\n"):
                stats.torn_tail = True  # the writer died mid-line: ignore the fragment
                return
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                stats.bad_lines += 1
                continue
            stats.records += 1
            yield record


def read_jsonl(path: str | os.PathLike[str], stats: JsonlReadStats | None = None) -> list[dict[str, Any]]:
    """All complete records of ``path`` (see ``iter_jsonl``)."""
    return list(iter_jsonl(path, stats))
