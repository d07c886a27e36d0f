"""Checkpoint folders: atomic commit, discovery, resume resolution and retention (torch-free).

A run's checkpoints live in one root folder, one complete checkpoint per ``step_<N>``
(``N`` = 1-indexed number of completed training steps). A save goes through three calls::

    mgr = CheckpointManager(root, keep_last=3, keep_every=100)
    partial = mgr.begin(step)              # root/.step_<N>.partial-<hex>, same filesystem
    ...                                     # trainer ranks and the driver write into `partial`
    final = mgr.commit(partial, step, meta={...})   # -> root/step_<N>
    # on failure instead: mgr.abort(partial)

``commit`` fsyncs every file and folder, writes ``meta.json`` *last* (so a folder without it
was never committed and is ignored by ``steps()``), renames the folder into place, then
applies retention. Replacing an existing ``step_<N>`` first moves the old one aside to
``.step_<N>.old-<hex>``; should the process die between the two renames,
``cleanup_partials()`` (run at start-up) moves it back, so the step is never lost.

Retention (seed semantics): after each commit keep the newest ``keep_last`` checkpoints,
every step divisible by ``keep_every`` and always the one just written; delete nothing when
both are ``None``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from telescope.core.config.errors import ConfigError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META_FILE",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "checkpoint_due",
    "retained_steps",
]

FORMAT = "telescope-checkpoint"
FORMAT_VERSION = 1
META_FILE = "meta.json"
SUPERSEDED = "superseded"
"""Where a resume from an older step moves the newer checkpoints (see ``set_aside_after``)."""
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL = re.compile(r"^\.step_(\d+)\.partial-[0-9a-f]+$")
_OLD = re.compile(r"^\.step_(\d+)\.old-[0-9a-f]+$")


class CheckpointNotFoundError(ConfigError):
    """``resume_from_checkpoint`` names a checkpoint that does not exist."""


def checkpoint_due(step: int, every: int | bool, number_of_steps: int) -> bool:
    """Whether to save after ``step`` completed steps (1-indexed).

    A falsy ``every`` disables checkpoints; otherwise every ``every``-th step and the last
    step (``number_of_steps``) are saved.
    """
    if not every or every is True:
        return False
    return step % int(every) == 0 or step == number_of_steps


def retained_steps(
    steps: list[int], just_written: int, keep_last: int | None, keep_every: int | None
) -> set[int]:
    """The steps retention keeps out of ``steps`` (everything when both limits are None)."""
    if keep_last is None and keep_every is None:
        return set(steps)
    keep = {just_written}
    if keep_last is not None:
        keep.update(sorted(steps)[-keep_last:] if keep_last > 0 else [])
    if keep_every is not None:
        keep.update(s for s in steps if s % keep_every == 0)
    return keep & (set(steps) | {just_written})


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` to disk (folders after their contents)."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            file = Path(dirpath) / name
            if file.is_file() and not file.is_symlink():
                _fsync_path(file)
        _fsync_path(Path(dirpath))


class CheckpointManager:
    """The checkpoints of one run under ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path, keep_last: int | None = None, keep_every: int | None = None) -> None:
        for name, value in (("keep_last", keep_last), ("keep_every", keep_every)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(
                    f"checkpoint_{name} is {value!r}: give an integer >= 1, or null for no limit"
                )
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every

    # --- writing ------------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """A fresh, empty folder beside the final one to write checkpoint ``step`` into."""
        self._check_step(step)
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".step_{step}.partial-{uuid.uuid4().hex[:12]}"
        partial.mkdir()
        return partial

    def commit(self, partial: str | Path, step: int, meta: dict[str, Any] | None = None) -> Path:
        """Seal ``partial`` as ``root/step_<step>`` (see the module docstring); returns that path."""
        self._check_step(step)
        partial = Path(partial)
        if not partial.is_dir() or not self._is_own_partial(partial):
            raise ValueError(
                f"{partial} is not a folder made by begin() under {self.root}; call begin(step) first"
            )
        record = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(meta or {}),
        }
        _fsync_tree(partial)
        tmp = partial / (META_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, partial / META_FILE)
        _fsync_path(partial)
        final = self.path(step)
        self._move_into_place(partial, final, step)
        self.apply_retention(step)
        return final

    def _move_into_place(self, partial: Path, final: Path, step: int) -> None:
        old = None
        if final.exists():
            old = self.root / f".step_{step}.old-{uuid.uuid4().hex[:12]}"
            os.rename(final, old)
        os.rename(partial, final)
        _fsync_path(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self, partial: str | Path) -> None:
        """Remove the folder of a failed save (nothing else is touched)."""
        partial = Path(partial)
        if self._is_own_partial(partial):
            shutil.rmtree(partial, ignore_errors=True)

    def cleanup_partials(self) -> int:
        """Remove leftovers of interrupted saves; put back a step moved aside by an interrupted
        replacement. Returns how many folders were removed."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for entry in sorted(self.root.iterdir()):
            old = _OLD.match(entry.name)
            if old and not self.path(int(old.group(1))).exists():
                os.rename(entry, self.path(int(old.group(1))))  # the replacement never landed
            elif old or _PARTIAL.match(entry.name):  # a step_<N> without meta.json is left alone
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        return removed

    def apply_retention(self, just_written: int) -> list[int]:
        """Delete the checkpoints retention does not keep; returns the deleted steps."""
        steps = self.steps()
        keep = retained_steps(steps, just_written, self.keep_last, self.keep_every)
        deleted = [s for s in steps if s not in keep]
        for s in deleted:
            # rename first: a half-deleted folder must not look like a checkpoint
            doomed = self.root / f".step_{s}.partial-{uuid.uuid4().hex[:12]}"
            os.rename(self.path(s), doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        return deleted

    def set_aside_after(self, step: int) -> list[Path]:
        """Move the checkpoints newer than ``step`` into ``root/superseded/<time>/`` (kept, not deleted).

        Why: a run resumed from an older step writes a new history; the first run's later
        checkpoints would otherwise be taken for its own by ``resume_from_checkpoint: true`` and by
        retention. Returns the new paths.
        """
        later = [s for s in self.steps() if s > step]
        if not later:
            return []
        aside = self.root / SUPERSEDED / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = aside.with_name(f"{aside.name}-{uuid.uuid4().hex[:6]}")
        aside.mkdir(parents=True)
        moved = []
        for s in later:
            os.rename(self.path(s), aside / self.path(s).name)
            moved.append(aside / self.path(s).name)
        _fsync_path(self.root)
        return moved

    # --- reading ------------------------------------------------------------------------
    def path(self, step: int) -> Path:
        """Where checkpoint ``step`` lives (whether or not it exists)."""
        return self.root / f"step_{step}"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints (``step_<int>`` folders with ``meta.json``), sorted."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and self._complete(entry):
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def resolve(self, resume_from_checkpoint: bool | int) -> Path:
        """The folder to resume from: ``True`` = latest, an int = that step.

        Raises ``CheckpointNotFoundError`` listing the checkpoints that do exist.
        """
        steps = self.steps()
        have = ", ".join(map(str, steps)) if steps else "none"
        if resume_from_checkpoint is False:
            raise ValueError("resolve(False): resume_from_checkpoint is false, there is nothing to resolve")
        if resume_from_checkpoint is True:
            if not steps:
                raise CheckpointNotFoundError(
                    f"resume_from_checkpoint: true, but {self.root} holds no complete checkpoint "
                    "(step_<N> folder with meta.json); start without resume_from_checkpoint or set checkpoint_dir"
                )
            return self.path(steps[-1])
        if resume_from_checkpoint not in steps:
            raise CheckpointNotFoundError(
                f"resume_from_checkpoint: {resume_from_checkpoint}, but {self.root} has no complete "
                f"checkpoint for that step; steps available: {have}"
            )
        return self.path(int(resume_from_checkpoint))

    def read_meta(self, path: str | Path) -> dict[str, Any]:
        """The ``meta.json`` of a checkpoint folder."""
        file = Path(path) / META_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path} has no {META_FILE}: it is not a committed checkpoint")
        data: dict[str, Any] = json.loads(file.read_text())
        return data

    def _is_own_partial(self, partial: Path) -> bool:
        return bool(_PARTIAL.match(partial.name)) and partial.resolve().parent == self.root.resolve()

    @staticmethod
    def _complete(folder: Path) -> bool:
        return folder.is_dir() and (folder / META_FILE).is_file()

    @staticmethod
    def _check_step(step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be an integer >= 0, got {step!r}")
