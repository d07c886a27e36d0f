"""Stop a run whose rollouts all fail, instead of letting it cycle through its dataset forever.

A prompt longer than ``max_model_len`` allows, or a request that errors, discards its group and
the run moves on to the next prompt; a run where *every* group fails that way would spin
without ever training. ``FailureStreak`` counts consecutive failed groups (a zero-advantage
group is a success: it was generated and scored) and ends the run with the reasons.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["FailureStreak", "RolloutsFailingError"]

_FIXES = {
    "prompt_too_long": "raise max_model_len (it must hold the prompt plus max_tokens) or drop the long prompts",
    "rollout_error": "see the inference server logs under <run_dir>/logs/inference and the warnings above",
}


class RolloutsFailingError(RuntimeError):
    """Every one of the last ``limit`` prompt groups failed."""


class FailureStreak:
    """Consecutive failed groups; ``record`` returns the error that ends the run, once due."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reasons: Counter[str] = Counter()
        self.last_detail = ""

    def record(self, failure: str | None) -> RolloutsFailingError | None:
        """``failure`` is the group's ``"<reason>: <detail>"``, or None for a group that was scored."""
        if failure is None:
            self.reasons.clear()
            return None
        reason, _, detail = failure.partition(":")
        self.reasons[reason] += 1
        self.last_detail = detail.strip()
        if sum(self.reasons.values()) < self.limit:
            return None
        counts = ", ".join(f"{reason} {n}" for reason, n in self.reasons.most_common())
        fixes = "; ".join(f"{r}: {_FIXES[r]}" for r in self.reasons if r in _FIXES)
        return RolloutsFailingError(
            f"none of the last {self.limit} prompt groups produced a rollout ({counts}); the latest: "
            f"{self.last_detail or reason}. {fixes}"
        )
