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

``PlainStdio`` (the console's plain mode, output that is not a terminal) cleans what passes:
ANSI colour codes are removed and a carriage-return redraw (a progress bar) is reduced to its
last state, one line per line. Ray's copies of the workers' output (``(TrainerWorker pid=..)``
in cyan, transformers' loading bars) are Python-level writes too, so they are cleaned as well.

The same cleaning serves every other reader of these logs: ``tail_lines`` (a log's last lines,
for a server's start-up error, the failure record in run.json and a dead trainer rank's report)
and ``strip_ansi`` (the dashboard's Logs page).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "STDOUT_LOG_NAME",
    "PlainLines",
    "PlainStdio",
    "StdioCapture",
    "StreamTee",
    "plain_line",
    "strip_ansi",
    "tail_lines",
    "without_process_prefix",
]

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


class _Wrapper:
    """A text stream in front of ``inner``; inactive, a plain pass-through.

    Every other attribute (``isatty``, ``fileno``, ``encoding`` ...) is the inner stream's,
    so terminal detection and the like behave as before.
    """

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.active = True

    def write(self, text: str) -> int:
        return self.inner.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StreamTee(_Wrapper):
    """A text stream that forwards to ``inner`` and, while active, appends to the sink."""

    def __init__(self, inner: TextIO, sink: _Sink) -> None:
        super().__init__(inner)
        self._sink = sink

    def write(self, text: str) -> int:
        written = self.inner.write(text)
        self.copy(text)
        return written

    def copy(self, text: str) -> None:
        """Append ``text`` to the file only (what a proxy in front of this tee shows elsewhere)."""
        if self.active and text:
            with contextlib.suppress(Exception):  # the copy must never break printing
                self._sink.write(text)


def _unwrap_inactive(stream: Any) -> Any:
    """Drop pass-through wrappers a previous capture had to leave in place."""
    while isinstance(stream, _Wrapper) and not stream.active:
        stream = stream.inner
    return stream


def _replace_streams(make: Any) -> dict[str, _Wrapper]:
    """Put ``make(stream)`` in place of ``sys.stdout`` and ``sys.stderr``; the wrappers by name."""
    wrappers: dict[str, _Wrapper] = {}
    for name in ("stdout", "stderr"):
        stream = _unwrap_inactive(getattr(sys, name))
        if stream is None:  # e.g. pythonw: nothing is printed, nothing to wrap
            continue
        wrappers[name] = make(stream)
        setattr(sys, name, wrappers[name])
    return wrappers


def _restore_streams(wrappers: dict[str, _Wrapper]) -> None:
    """Undo ``_replace_streams``: a wrapper still in place is removed, one wrapped since stays inactive."""
    for name, wrapper in wrappers.items():
        wrapper.active = False
        if getattr(sys, name) is wrapper:
            setattr(sys, name, _unwrap_inactive(wrapper.inner))
    wrappers.clear()


#: CSI (colours, cursor moves), OSC (titles, links) and two-character escape sequences.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


#: C0 controls but tab and newline, DEL, and C1 controls (a lone ESC or CSI starts a sequence).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe for a terminal: no escape sequences and no control characters but tab and newline
    (a run directory is data from wherever it came from: a title or clear-screen sequence in a
    sample must not reach the user's terminal)."""
    return _CONTROL.sub("", _ANSI.sub("", text))


def printable_data(value: Any) -> Any:
    """``value`` (JSON-like data) with every string, key included, made ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_data(v) for v in value]
    return value


#: The prefix Ray puts before a worker's line: ``(TrainerWorker pid=123, ip=10.0.0.2) ``.
_RAY_PREFIX = re.compile(r"^\([^()]*pid=[^()]*\) ")


def without_process_prefix(line: str) -> str:
    """``line`` without the ``(Name pid=..)`` prefix Ray (and vLLM's own processes) put in front."""
    return _RAY_PREFIX.sub("", line, count=1)


def plain_line(line: str) -> str:
    """``line`` as a log file should hold it: no ANSI codes, a ``\\r`` redraw reduced to its last
    state (Ray's ``(Worker pid=..)`` prefix in front of it is kept)."""
    line = strip_ansi(line)
    prefix = _RAY_PREFIX.match(line)
    head = prefix.group(0) if prefix else ""
    segments = line[len(head) :].split("\r")
    return head + next((seg for seg in reversed(segments) if seg.strip()), "")


_TAIL_CHUNK = 64 * 1024


def tail_lines(path: str | Path, lines: int = 30) -> list[str]:
    """The last ``lines`` lines of the log file ``path``, each through ``plain_line`` (no colour
    codes, a progress bar's ``\\r`` redraws reduced to their last state); empty when it cannot
    be read. Reads back from the end in chunks, so a long log costs what its tail costs."""
    if lines <= 0:
        return []
    chunks: list[bytes] = []  # from the end backwards
    newlines = trailing = 0  # all newlines read; those at the very end (before any other byte)
    only_newlines = True
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, 2)
            # stop once the tail holds `lines` newlines besides the trailing ones: the text before
            # the first of them may be a cut line (or a cut UTF-8 character) and is left out
            while pos > 0 and (only_newlines or newlines - trailing < lines):
                step = min(_TAIL_CHUNK, pos)
                pos -= step
                f.seek(pos)
                chunks.append(f.read(step))
                newlines += chunks[-1].count(b"\n")
                if only_newlines:
                    kept = chunks[-1].rstrip(b"\n")
                    trailing += len(chunks[-1]) - len(kept)
                    only_newlines = not kept
    except OSError:
        return []
    # split on '\n' only: a progress bar's '\r' redraws stay on their line (universal newlines split them)
    text = b"".join(reversed(chunks)).decode("utf-8", errors="replace").rstrip("\n")
    return [plain_line(line) for line in text.split("\n")[-lines:]] if text else []


def _last_redraw(pending: str) -> str:
    """``pending`` with its finished ``\\r`` redraws reduced to the last one (what ``plain_line``
    would keep of them) and the redraw in progress kept whole: ``plain_line`` of the result is
    ``plain_line(pending)``, and a progress bar that never prints a newline stays small."""
    done, cr, current = pending.rpartition("\r")
    return plain_line(done) + cr + current if cr else pending


class PlainLines(_Wrapper):
    """Passes whole lines on, each through ``plain_line``; a partial line waits for its newline
    (a progress bar redrawn with ``\\r`` becomes one line, in its final state) or for
    ``flush_pending``. ``flush()`` does not write the partial line out: progress bars flush after
    every redraw, which would then become a line each."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__(inner)
        self._pending = ""
        self._lock = threading.Lock()
        self._tee = _tee_behind_proxy(inner)

    @property
    def pending_chars(self) -> int:
        """Characters of the partial line held back (bounded by its last ``\\r`` redraw)."""
        return len(self._pending)

    def write(self, text: str) -> int:
        if not self.active:
            return self.inner.write(text)
        with self._lock:
            *lines, pending = (self._pending + text).split("\n")
            self._pending = _last_redraw(pending)
            if lines:
                self._pass_on("".join(plain_line(line) + "\n" for line in lines))
        return len(text)

    def _pass_on(self, cleaned: str) -> None:
        self.inner.write(cleaned)
        if self._tee is not None:  # live mode: rich's proxy prints to the terminal, not to the tee
            self._tee.copy(cleaned)

    def flush_pending(self) -> None:
        """Write out a last line that never got its newline (to the run directory's copy too)."""
        with self._lock:
            pending, self._pending = plain_line(self._pending), ""
            if pending:
                self._pass_on(pending + "\n")
        self.inner.flush()


def _tee_behind_proxy(stream: Any) -> StreamTee | None:
    """The run directory's tee behind a rich ``FileProxy`` (the live display's redirect prints to the
    terminal itself, so what passes would miss telescope.stdout.log); None otherwise."""
    proxied = getattr(stream, "rich_proxied_file", None)
    while isinstance(proxied, _Wrapper):
        if isinstance(proxied, StreamTee) and proxied.active:
            return proxied
        proxied = proxied.inner
    return None


class PlainStdio:
    """Clean ``sys.stdout`` and ``sys.stderr`` (``PlainLines``) between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self._wrappers: dict[str, _Wrapper] = {}

    def start(self) -> None:
        if not self._wrappers:
            self._wrappers = _replace_streams(PlainLines)

    def stop(self) -> None:
        for wrapper in self._wrappers.values():
            if isinstance(wrapper, PlainLines):
                with contextlib.suppress(Exception):
                    wrapper.flush_pending()
        _restore_streams(self._wrappers)


class StdioCapture:
    """Tee ``sys.stdout`` and ``sys.stderr`` into ``path`` between ``start`` and ``stop``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sink: _Sink | None = None
        self._tees: dict[str, _Wrapper] = {}

    def start(self) -> None:
        if self._sink is not None:
            raise RuntimeError(f"stdout capture into {self.path} is already running: call stop() first")
        sink = self._sink = _Sink(self.path)
        self._tees = _replace_streams(lambda stream: StreamTee(stream, sink))

    def stop(self) -> None:
        _restore_streams(self._tees)
        if self._sink is not None:
            self._sink.close()
            self._sink = None
