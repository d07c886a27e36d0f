"""Longest-common-subsequence length, bit-parallel (exact, fast on long inputs)."""

from __future__ import annotations

__all__ = ["lcs_length", "lcs_ratio"]


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of ``a`` and ``b``.

    Hyyrö's bit-vector algorithm: one big-int update per character of the longer string,
    O(len(b) * len(a) / 64) word operations instead of a full DP table.
    """
    if len(a) > len(b):
        a, b = b, a
    if not a:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def lcs_ratio(a: str, b: str) -> float:
    """``2 * LCS / (len(a) + len(b))`` in [0, 1]; 1.0 for two empty strings."""
    if not a and not b:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))
