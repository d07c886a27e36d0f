"""Stop a run whose rollouts all fail, instead of letting it cycle through its dataset forever.

A prompt longer than ``max_model_len`` allows, a request that errors, or a reward that raises
for every sample discards its group and the run moves on to the next prompt; a run where
*every* group of an environment fails that way would spin without ever training on it.
``FailureStreaks`` counts consecutive failed groups per environment (a zero-advantage group
is a success: it was generated and scored), so an environment that always fails stops the
run with its name even while the other environments train.
"""

from __future__ import annotations

from collections import Counter

from telescope.core.rollouts.groups import GroupFailure

__all__ = ["FailureStreak", "FailureStreaks", "RolloutsFailingError"]

_FIXES = {
    "prompt_too_long": "raise max_model_len (it must hold the prompt plus max_tokens) or drop the long prompts",
    "rollout_error": "see the inference server logs under <run_dir>/logs/inference and the warnings above",
    "reward_error": "the first failure of each reward function, with its traceback, is in "
    "<run_dir>/logs/telescope.log: fix the reward function or the environment's kwargs",
}


class RolloutsFailingError(RuntimeError):
    """Every one of the last ``limit`` prompt groups (of one environment) failed."""


class FailureStreak:
    """Consecutive failed groups; ``record`` returns the error that ends the run, once due."""

    def __init__(self, limit: int, env: str | None = None) -> None:
        self.limit = limit
        self.env = env
        self.reasons: Counter[str] = Counter()
        self.last_detail = ""

    def record(self, failure: GroupFailure | None) -> RolloutsFailingError | None:
        """``failure`` is why the group failed, or None for a group that was scored."""
        if failure is None:
            self.reasons.clear()
            return None
        self.reasons[failure.reason] += 1
        self.last_detail = failure.message
        if sum(self.reasons.values()) < self.limit:
            return None
        counts = ", ".join(f"{reason} {n}" for reason, n in self.reasons.most_common())
        fixes = "; ".join(f"{r}: {_FIXES[r]}" for r in self.reasons if r in _FIXES)
        of_env = f" of environment '{self.env}'" if self.env is not None else ""
        return RolloutsFailingError(
            f"none of the last {self.limit} prompt groups{of_env} produced a usable rollout ({counts}); "
            f"the latest: {self.last_detail or failure.reason}. {fixes}"
        )


class FailureStreaks:
    """One ``FailureStreak`` per environment: the others' successes do not mask a failing one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.by_env: dict[str, FailureStreak] = {}

    @classmethod
    def for_batch_size(cls, prompts_per_batch: int) -> FailureStreaks:
        """The run's limit: ``max(200, 4 x prompts_batch_size_for_trainer)`` failed groups in a row."""
        return cls(max(200, 4 * prompts_per_batch))

    def record(self, env: str, failure: GroupFailure | None) -> RolloutsFailingError | None:
        """Count one finished group of ``env``; returns the error that ends the run, once due."""
        streak = self.by_env.get(env)
        if streak is None:
            streak = self.by_env[env] = FailureStreak(self.limit, env)
        return streak.record(failure)
