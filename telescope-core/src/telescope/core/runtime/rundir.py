"""One run per run directory: a lock held by the live run, and no silent appends to an old run.

Two runs writing one directory interleave their metrics, replace each other's checkpoints
and rewrite ``run.json`` under each other; a new run started in an old run's directory
draws both histories as one. So a live run holds ``RUN_DIR/.telescope.lock`` (``flock``:
the kernel releases it when the process dies, however it dies, so a stale lock file is
simply taken over), and a non-empty directory is used only to resume, or replaced when the
user asks for it (``overwrite``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from telescope.core.config import ConfigError

__all__ = ["LOCK_FILE", "RunDirLock", "check_run_dir_free"]

log = logging.getLogger("telescope.runtime")

LOCK_FILE = ".telescope.lock"


def _holder(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a live run (its pid is not recorded yet)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started_at", 0))))
    return f"the live run with pid {holder.get('pid')} on {holder.get('host')} (started {started})"


class RunDirLock:
    """``flock`` on ``RUN_DIR/.telescope.lock`` for the life of a run; records who holds it."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock or raise ``ConfigError`` naming the run that holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder(f.read())
            f.close()
            raise ConfigError(
                f"run_dir {self.run_dir} is in use by {_describe(holder)}; wait for it to end or stop it, "
                "or choose another --run_dir"
            ) from None
        f.seek(0)
        previous = _holder(f.read())
        if previous.get("pid"):
            log.info(
                "run_dir %s: taking over the lock of pid %s, which is no longer running",
                self.run_dir,
                previous["pid"],
            )
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started_at": time.time(),
                    "argv": sys.argv,
                }
            )
        )
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Clear the holder record and unlock (the file stays: unlinking it could let two runs lock)."""
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self._file.truncate(0)
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _leftovers(run_dir: Path) -> list[Path]:
    """Top-level entries holding at least one file (empty folders and the lock do not count)."""
    out = []
    for entry in sorted(run_dir.iterdir()):
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not any(p.is_file() or p.is_symlink() for p in entry.rglob("*")):
            continue
        out.append(entry)
    return out


def check_run_dir_free(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a non-empty ``run_dir`` unless resuming; with ``overwrite``, delete the previous run in it.

    Only a directory that holds a Telescope run (``run.json``) is ever deleted.
    """
    if resume or not run_dir.is_dir():
        return
    leftovers = _leftovers(run_dir)
    if not leftovers:
        return
    names = ", ".join(p.name for p in leftovers[:5]) + (", ..." if len(leftovers) > 5 else "")
    if not overwrite:
        raise ConfigError(
            f"run_dir {run_dir} is not empty ({names}); continue that run with --resume_from_checkpoint true, "
            "choose a new --run_dir, or replace it with --overwrite (deletes its files)"
        )
    if not (run_dir / "run.json").is_file():
        raise ConfigError(
            f"run_dir {run_dir} is not empty ({names}) and holds no Telescope run (no run.json), so "
            "--overwrite will not delete it; choose a new or empty --run_dir"
        )
    for entry in leftovers:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    log.warning("run_dir %s: overwrite: deleted the previous run's files (%s)", run_dir, names)
