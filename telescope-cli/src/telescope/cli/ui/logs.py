"""The run's log files (``logs/**/*.log``), followed incrementally and filtered.

Each line becomes an entry ``{seq, file, component, level, time, text}``. The component is
where the line came from: ``driver`` (telescope.log), ``driver (detailed)``
(telescope.detailed.log), ``server i`` (inference/server_i.log), and for the driver's captured
output (telescope.stdout.log) the Ray actor process that printed it (``TrainerWorker pid 12``,
one per trainer rank, from Ray's ``(TrainerWorker pid=12)`` prefix) or ``stdout``. The level is the first logging level word
near the start of a timestamped line; continuation lines keep the level of the line they
continue, but a traceback is an error whatever level it was logged at (the runtime logs a
failure's traceback at INFO so the console does not repeat it): a line followed by
``Traceback (most recent call last):`` and its continuation lines are ERROR. Each file keeps its newest ``MAX_LINES_PER_FILE`` entries in memory.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.cli.ui.confine import is_inside
from telescope.cli.ui.tail import FileTail
from telescope.core.observe.rundir.layout import LOGS_DIR
from telescope.core.observe.stdio import strip_ansi

__all__ = ["LEVELS", "LogStore", "parse_line"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_LINES_PER_FILE = 20_000
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?)\s+")
_RAY_PREFIX = re.compile(r"^\((\w+)(?: pid=(\d+))?[^)]*\)\s?")
TRACEBACK_START = "Traceback (most recent call last):"
_LEVEL_WORD = {"WARN": "WARNING", "FATAL": "CRITICAL", **{lv: lv for lv in LEVELS}}


@dataclass
class ParsedLine:
    time: str
    level: str | None
    """None for a continuation line (no timestamp, no level word)."""
    actor: str | None
    text: str


def parse_line(raw: str) -> ParsedLine:
    """Timestamp, level, Ray actor prefix and text of one log line."""
    text = strip_ansi(raw).rstrip("\r")
    actor = None
    prefix = _RAY_PREFIX.match(text)
    if prefix:
        actor = prefix.group(1) + (f" pid {prefix.group(2)}" if prefix.group(2) else "")
        text = text[prefix.end() :]
    stamp = _STAMP.match(text)
    level = None
    if stamp:
        for word in text[stamp.end() :].split(None, 3)[:3]:
            if word.rstrip(":") in _LEVEL_WORD:
                level = _LEVEL_WORD[word.rstrip(":")]
                break
        level = level or "INFO"
    return ParsedLine(stamp.group(1) if stamp else "", level, actor, text)


def component_of(rel: str) -> str:
    name = Path(rel).name
    if name == "telescope.log":
        return "driver"
    if name == "telescope.detailed.log":
        return "driver (detailed)"
    if name == "telescope.stdout.log":
        return "stdout"
    match = re.match(r"server_(\d+)\.log$", name)
    if match:
        return f"server {match.group(1)}"
    return rel.removesuffix(".log")


class _LogFile:
    def __init__(self, path: Path, rel: str) -> None:
        self.rel = rel
        self.component = component_of(rel)
        self.tail = FileTail(path)
        self.entries: deque[dict[str, Any]] = deque(maxlen=MAX_LINES_PER_FILE)
        self.level = "INFO"
        self.time = ""
        self.head: dict[str, Any] | None = None
        """The entry of the latest timestamped line (a traceback after it raises it to ERROR)."""


class LogStore:
    """Entries of every log file of one run (see module doc)."""

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / LOGS_DIR
        self._files: dict[Path, _LogFile] = {}
        self.seq = 0
        """Sequence number of the newest entry (``after=`` asks for newer ones)."""

    def refresh(self) -> None:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.rglob("*.log")):
            if not is_inside(path, self.root.parent):  # a symlink out of the run: never read
                continue
            log = self._files.get(path)
            if log is None:
                log = self._files[path] = _LogFile(path, path.relative_to(self.root).as_posix())
            lines, reset = log.tail.read_lines()
            if reset:
                log.entries.clear()
            for line in lines:
                self._add(log, line.data.decode("utf-8", errors="replace"))

    def _add(self, log: _LogFile, raw: str) -> None:
        # tqdm bars rewrite themselves with \r: keep the last state only
        parsed = parse_line(raw.rsplit("\r", 1)[-1] if raw.strip("\r") else raw)
        if not parsed.text.strip():
            return
        if parsed.level is not None:
            log.level, log.time = parsed.level, parsed.time
        elif parsed.text.startswith(TRACEBACK_START) and LEVELS.index(log.level) < LEVELS.index("ERROR"):
            log.level = "ERROR"
            if log.head is not None:
                log.head["level"] = "ERROR"
        component = parsed.actor if parsed.actor and log.component == "stdout" else log.component
        self.seq += 1
        entry = {
            "seq": self.seq,
            "file": log.rel,
            "component": component,
            "level": log.level,
            "time": log.time,
            "text": parsed.text,
        }
        log.entries.append(entry)
        if parsed.level is not None:
            log.head = entry

    def components(self) -> list[str]:
        return sorted(
            {e["component"] for log in self._files.values() for e in log.entries}
            | {log.component for log in self._files.values()}
        )

    def query(
        self,
        *,
        components: list[str] | None = None,
        level: str | None = None,
        text: str | None = None,
        after: int = 0,
        limit: int = 500,
    ) -> dict[str, Any]:
        """The newest ``limit`` entries matching the filters (with ``seq > after``), oldest first."""
        self.refresh()
        floor = LEVELS.index(level) if level in LEVELS else 0
        needle = (text or "").lower()
        wanted = set(components) if components else None
        found = [
            e
            for log in self._files.values()
            for e in log.entries
            if e["seq"] > after
            and (wanted is None or e["component"] in wanted)
            and LEVELS.index(e["level"]) >= floor
            and (not needle or needle in e["text"].lower())
        ]
        found.sort(key=lambda e: (e["time"] or "", e["seq"]))
        return {
            "entries": found[-limit:],
            "matched": len(found),
            "seq": self.seq,
            "components": self.components(),
        }
