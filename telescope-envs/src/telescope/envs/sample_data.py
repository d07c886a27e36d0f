"""Small sample data files shipped with telescope-envs (written by us; <= 200 rows each)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "sample_path"]

DATA_DIR = Path(__file__).resolve().parent / "data"


def sample_path(name: str) -> Path:
    """Path of the shipped sample file ``name`` (e.g. ``"gsm8k.jsonl"``)."""
    path = DATA_DIR / name
    if not path.exists():
        shipped = ", ".join(sorted(p.name for p in DATA_DIR.iterdir()))
        raise FileNotFoundError(f"no shipped sample file {name!r}; shipped: {shipped}")
    return path
