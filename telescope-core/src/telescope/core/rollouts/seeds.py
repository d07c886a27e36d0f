"""Sampling seeds of rollout requests: stable across processes and runs with the same ``seed``."""

from __future__ import annotations

import zlib

__all__ = ["request_seed", "turn_seed"]


def request_seed(run_seed: int, *parts: object) -> int:
    """A stable 31-bit sampling seed for one request (``hash()`` differs between processes)."""
    return zlib.crc32(":".join(str(p) for p in (run_seed, *parts)).encode()) & 0x7FFFFFFF


def turn_seed(sample_seed: int | None, turn: int) -> int | None:
    """Turn ``turn``'s sampling seed from the sample's (``SampleTask.seed``; None: unseeded)."""
    return None if sample_seed is None else sample_seed + turn
