"""Which source files a code upload takes: size cap and glob exclusions (seed ``wandb_code_*``)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

__all__ = ["is_excluded", "select_code_files"]


def is_excluded(rel_path: str, patterns: list[str]) -> bool:
    """True when any path component, or the whole relative path, matches a glob pattern.

    ``.venv`` excludes every file under a ``.venv`` folder at any depth; ``*.egg-info``
    matches such folders; ``docs/*.md`` matches against the path from the root.
    """
    parts = Path(rel_path).parts
    for pattern in patterns:
        if fnmatch.fnmatch(rel_path, pattern) or any(fnmatch.fnmatch(p, pattern) for p in parts):
            return True
    return False


def select_code_files(root: str | Path, max_file_size_mb: float, exclude_patterns: list[str]) -> list[str]:
    """Relative paths (sorted) under ``root`` not excluded and at most ``max_file_size_mb`` MiB.

    Excluded folders are not descended into, so a large ``.venv`` costs nothing.
    """
    root = Path(root)
    limit = max_file_size_mb * 1024 * 1024
    selected = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = sorted(
            d for d in dirnames if not is_excluded(os.path.join(rel_dir, d), exclude_patterns)
        )
        for name in filenames:
            rel = os.path.join(rel_dir, name)
            full = Path(dirpath) / name
            if is_excluded(rel, exclude_patterns) or full.is_symlink():
                continue
            if full.stat().st_size <= limit:
                selected.append(rel)
    return sorted(selected)
