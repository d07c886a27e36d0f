"""A run never hangs: failures of its parts end it with what, where and the fix; stalls are diagnosed.

- ``stage_error`` (``telescope.core.errors``): any exception in the trainer loop, the prompt
  prefetch or a rollout task becomes one ``RunStageError`` naming the stage and the step.
- ``StallError``: no training step completed for ``stall_timeout_s``; raised after the
  orchestrator logged what every server, lane and group was doing.
- ``DiscardTally``: the groups discarded since the last step, by reason and environment, for
  the line printed every few seconds while no batch fills.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["DiscardTally", "StallError"]


class StallError(RuntimeError):
    """No training step completed within ``stall_timeout_s``."""


class DiscardTally:
    """Groups discarded since the last completed step, by reason and environment."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def add(self, reason: str, env: str) -> None:
        self.counts[(reason, env)] += 1

    def reset(self) -> None:
        self.counts.clear()

    def __bool__(self) -> bool:
        return bool(self.counts)

    def summary(self) -> str:
        """``zero_advantage 120 (reverse_text 100, wordle 20), rollout_error 3 (wordle 3)``."""
        by_reason: dict[str, Counter[str]] = {}
        for (reason, env), n in self.counts.items():
            by_reason.setdefault(reason, Counter())[env] += n
        parts = []
        for reason, envs in sorted(by_reason.items(), key=lambda kv: -sum(kv[1].values())):
            detail = ", ".join(f"{env} {n}" for env, n in envs.most_common())
            parts.append(f"{reason} {sum(envs.values())} ({detail})")
        return ", ".join(parts)
