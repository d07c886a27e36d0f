"""Whether the Megatron-Core backend can run in this interpreter (light: no torch, no megatron import).

``megatron-core`` is looked up with ``importlib`` (spec and distribution metadata), never
imported, so ``telescope plugins list`` stays fast and works without CUDA.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["MIN_MEGATRON_CORE", "MIN_PYTHON", "unavailable_reason"]

MIN_PYTHON = (3, 12)
"""megatron-core 0.14+ declares ``requires-python >= 3.12``."""
MIN_MEGATRON_CORE = (0, 19)
"""The megatron-core release this backend was written and CPU-verified against (0.19.2)."""

INSTALL_HINT = "pip install megatron-core (or the 'megatron' extra of telescope-megatron)"


def unavailable_reason(
    python_version: tuple[int, ...] = tuple(sys.version_info[:3]),
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    version_of: Callable[[str], str] = importlib.metadata.version,
) -> str | None:
    """Why the ``megatron`` backend cannot run here, or ``None`` when it can.

    The arguments exist so tests can simulate other interpreters and installs.
    """
    if tuple(python_version[:2]) < MIN_PYTHON:
        have = ".".join(str(x) for x in python_version[:3])
        return (
            f"megatron-core requires Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} but this is Python {have}; "
            f"run Telescope in a Python 3.12+ environment and {INSTALL_HINT}, or use train_backend: fsdp"
        )
    try:
        found = find_spec("megatron.core") is not None
    except (ImportError, ValueError):  # parent package 'megatron' missing or broken
        found = False
    if not found:
        return f"megatron-core is not installed: {INSTALL_HINT}, or use train_backend: fsdp"
    try:
        version = version_of("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None  # a source checkout on sys.path: importable, version unknown
    if _parse_version(version) < MIN_MEGATRON_CORE:
        need = ".".join(str(x) for x in MIN_MEGATRON_CORE)
        return f"megatron-core {version} is too old (need >= {need}): pip install -U megatron-core"
    return None


def _parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
