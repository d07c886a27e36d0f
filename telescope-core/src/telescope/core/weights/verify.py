"""Checking a whole sync from the orchestrator's side (no heavy imports).

The sender's ``SyncReport.fingerprints`` are compared with the fingerprints every server returned
after loading (``WeightUpdateResponse.fingerprints``); any difference stops the run.
"""

from __future__ import annotations

from telescope.core.weights.errors import WeightSyncMismatchError

__all__ = ["check_sync", "compare_fingerprints"]


def compare_fingerprints(expected: dict[str, str], actual: dict[str, str], where: str) -> None:
    """Raise ``WeightSyncMismatchError`` naming every tensor whose fingerprints differ or are missing."""
    differing = sorted(n for n in expected if n in actual and expected[n] != actual[n])
    missing = sorted(n for n in expected if n not in actual)
    extra = sorted(n for n in actual if n not in expected)
    if differing or missing or extra:
        detail = []
        if missing:
            detail.append(f"missing on the receiving side: {', '.join(missing[:10])}")
        if extra:
            detail.append(f"not sent: {', '.join(extra[:10])}")
        raise WeightSyncMismatchError(where, differing + missing + extra, "; ".join(detail))


def check_sync(sent: dict[str, str] | None, loaded: dict[str, dict[str, str] | None], version: int) -> None:
    """Compare the sender's fingerprints with each server's (``loaded`` maps server URL -> fingerprints).

    A server that returned no fingerprints while the sender verified is itself a failure: the
    check must never pass by omission.
    """
    if sent is None:
        return
    for server, fingerprints in loaded.items():
        if fingerprints is None:
            raise WeightSyncMismatchError(
                f"version {version}, {server}", sorted(sent), "server returned no fingerprints"
            )
        compare_fingerprints(sent, fingerprints, where=f"version {version}, {server}")
