"""The dashboard reads only files inside their run directory (a symlink may not lead it elsewhere).

A run directory is data someone may hand you: a ``logs/x.log`` (or ``config.yaml``, a rollout block,
a ``logs/sub`` folder) that is a symbolic link to a file outside the run used to be served as the
run's own. Every file the dashboard reads goes through ``open_run_file`` or ``check_inside``: its real
path must lie inside the real path of its run directory (the nearest folder above it holding
``run.json``), and the last component is opened without following a link that was swapped in since.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from telescope.core.observe.rundir.layout import RUN_FILE

__all__ = ["OutsideRunDir", "check_inside", "is_inside", "open_run_file", "run_root"]


class OutsideRunDir(ValueError):
    """A run file that resolves outside its run directory (served as HTTP 400 naming both paths)."""


@lru_cache(maxsize=4096)
def run_root(path: Path) -> Path | None:
    """The run directory of ``path``: the nearest folder above it (lexically) that holds run.json."""
    for folder in path.parents:
        if os.path.lexists(folder / RUN_FILE):
            return folder
    return None


def is_inside(path: Path, root: Path | None = None) -> bool:
    """Whether ``path`` resolves inside ``root`` (default: its run directory; a file under no run
    directory, which the dashboard never lists, is checked only for a link at its last component)."""
    base = root if root is not None else run_root(Path(path))
    if base is None:
        return True
    real_root = os.path.realpath(base)
    return os.path.realpath(path).startswith(real_root.rstrip(os.sep) + os.sep)


def check_inside(path: Path, root: Path | None = None) -> None:
    """Raise ``OutsideRunDir`` unless ``path`` resolves inside ``root`` (default: its run directory)."""
    if not is_inside(path, root):
        base = root if root is not None else run_root(Path(path))
        raise OutsideRunDir(
            f"refused {path}: it resolves to {os.path.realpath(path)}, outside the run directory "
            f"{base} (a symbolic link); the dashboard serves only a run's own files"
        )


def open_run_file(path: Path) -> BinaryIO:
    """``open(path, "rb")`` for a file inside its run directory, never through a symbolic link at its
    last component; ``OutsideRunDir`` otherwise (``FileNotFoundError`` when it is missing)."""
    check_inside(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if os.path.islink(path):  # ELOOP: replaced by a link after the check
            raise OutsideRunDir(
                f"refused {path}: a symbolic link; the dashboard serves only a run's own files"
            ) from None
        raise exc
    return os.fdopen(fd, "rb")
