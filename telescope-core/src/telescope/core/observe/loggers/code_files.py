"""Which source files a code upload takes (seed ``wandb_code_*``).

Source files only, by name (``SOURCE_SUFFIXES``, ``SOURCE_NAMES``), up to the size cap, minus the
user's glob exclusions, and never what looks like a secret (``SECRET_PATTERNS``: dotenv files,
SSH and TLS keys, cloud credentials, token stores), whatever the exclusions say: the working
directory of a run often holds a ``.env`` or an ``id_rsa`` that must not leave the machine.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

__all__ = [
    "SECRET_PATTERNS",
    "SOURCE_NAMES",
    "SOURCE_SUFFIXES",
    "is_excluded",
    "is_source",
    "select_code_files",
]

#: File suffixes a code upload takes: code and the configs that go with it.
SOURCE_SUFFIXES = frozenset(
    {
        ".py",
        ".pyi",
        ".ipynb",
        ".yaml",
        ".yml",
        ".toml",
        ".cfg",
        ".ini",
        ".md",
        ".rst",
        ".txt",
        ".sh",
        ".jinja",
        ".j2",
        ".js",
        ".ts",
        ".html",
        ".css",
        ".c",
        ".cc",
        ".cpp",
        ".h",
        ".hpp",
        ".cu",
        ".rs",
        ".go",
    }
)
#: Whole file names a code upload takes besides those suffixes.
SOURCE_NAMES = frozenset({"Dockerfile", "Makefile", "Containerfile"})
#: Never uploaded, matched like the exclusions (any path component, or the relative path).
SECRET_PATTERNS = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    ".netrc",
    ".pgpass",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    "*credential*",
    "*secret*",
    ".aws",
    ".ssh",
    ".gnupg",
    ".docker",
    ".kube",
    ".azure",
    ".gcloud",
    ".config",
    ".git",
    "*.kdbx",
    "htpasswd",
    ".htpasswd",
)


def is_source(rel_path: str) -> bool:
    """Whether a code upload may take ``rel_path``: a source file by name, and nothing secret-looking."""
    name = Path(rel_path).name
    by_name = name in SOURCE_NAMES or Path(name).suffix.lower() in SOURCE_SUFFIXES
    return by_name and not is_excluded(rel_path, list(SECRET_PATTERNS))


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
    """Relative paths (sorted) of the source files under ``root`` (``is_source``) not excluded and at
    most ``max_file_size_mb`` MiB.

    Excluded and secret folders are not descended into, so a large ``.venv`` costs nothing.
    """
    skip = [*exclude_patterns, *SECRET_PATTERNS]
    root = Path(root)
    limit = max_file_size_mb * 1024 * 1024
    selected = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = sorted(d for d in dirnames if not is_excluded(os.path.join(rel_dir, d), skip))
        for name in filenames:
            rel = os.path.join(rel_dir, name)
            full = Path(dirpath) / name
            if is_excluded(rel, exclude_patterns) or not is_source(rel) or full.is_symlink():
                continue
            if full.stat().st_size <= limit:
                selected.append(rel)
    return sorted(selected)
