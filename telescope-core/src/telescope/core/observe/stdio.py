"""Copy what the driver process prints into the run directory (``logs/telescope.stdout.log``).

``StdioCapture`` replaces ``sys.stdout`` and ``sys.stderr`` with ``StreamTee`` objects that
pass every write on unchanged and append it to one file, flushed at once (a killed run keeps
what was printed). This covers Python-level writes: ``print``, logging stream handlers,
warnings, and the trainer workers' output that Ray forwards to the driver
(``ray_log_to_driver``). Output written straight to the file descriptors (C code,
subprocesses) is not seen; inference servers have their own files under ``logs/``.

``stop`` restores the streams it replaced when they are still in place. When something
wrapped them later (W&B's console capture, a test harness), the tee stays in that chain as
a plain pass-through and the next capture unwraps it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

__all__ = ["STDOUT_LOG_NAME", "StdioCapture", "StreamTee"]

#: File name under ``RUN_DIR/logs`` (the ``*.stdout.log`` files follow ``wandb_upload_logs_stdout``).
STDOUT_LOG_NAME = "telescope.stdout.log"


class _Sink:
    """The shared file both tees append to (one lock, so lines of two streams never mix)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(text)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class StreamTee:
    """A text stream that forwards to ``inner`` and, while active, appends to the sink.

    Every other attribute (``isatty``, ``fileno``, ``encoding`` ...) is the inner stream's,
    so terminal detection and the like behave as before.
    """

    def __init__(self, inner: TextIO, sink: _Sink) -> None:
        self.inner = inner
        self._sink = sink
        self.active = True

    def write(self, text: str) -> int:
        written = self.inner.write(text)
        if self.active and text:
            with contextlib.suppress(Exception):  # the copy must never break printing
                self._sink.write(text)
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _unwrap_inactive(stream: Any) -> Any:
    """Drop pass-through tees a previous capture had to leave in place."""
    while isinstance(stream, StreamTee) and not stream.active:
        stream = stream.inner
    return stream


class StdioCapture:
    """Tee ``sys.stdout`` and ``sys.stderr`` into ``path`` between ``start`` and ``stop``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sink: _Sink | None = None
        self._tees: dict[str, StreamTee] = {}

    def start(self) -> None:
        if self._sink is not None:
            raise RuntimeError(f"stdout capture into {self.path} is already running: call stop() first")
        self._sink = _Sink(self.path)
        for name in ("stdout", "stderr"):
            stream = _unwrap_inactive(getattr(sys, name))
            if stream is None:  # e.g. pythonw: nothing is printed, nothing to copy
                continue
            tee = StreamTee(stream, self._sink)
            self._tees[name] = tee
            setattr(sys, name, tee)

    def stop(self) -> None:
        for name, tee in self._tees.items():
            tee.active = False
            if getattr(sys, name) is tee:
                setattr(sys, name, _unwrap_inactive(tee.inner))
        self._tees.clear()
        if self._sink is not None:
            self._sink.close()
            self._sink = None
