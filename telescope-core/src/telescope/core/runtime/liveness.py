"""A run never hangs: failures of its parts end it with what, where and the fix; stalls are diagnosed.

- ``stage_error``: any exception in the trainer loop (a train step, a weight sync, a step
  hook, a run hook), the prompt prefetch or a rollout task becomes one ``RunStageError``
  whose message names the stage and the step; the full traceback goes to the log file.
- ``StallError``: no training step completed for ``stall_timeout_s``; raised after the
  orchestrator logged what every server, lane and group was doing.
- ``DiscardTally``: the groups discarded since the last step, by reason and environment, for
  the line printed every few seconds while no batch fills.
"""

from __future__ import annotations

import logging
from collections import Counter

from telescope.core.runtime.errors import describe_failure

__all__ = ["DiscardTally", "RunStageError", "StallError", "stage_error"]

log = logging.getLogger("telescope.orchestrator")

_FIXES = {
    "train_step": "the trainer's traceback is in <run_dir>/logs/telescope.log",
    "weight sync": "an inference server may have died or stopped answering: see <run_dir>/logs/inference",
    "prompt preparation": "check the environment's kwargs and dataset (the traceback is in "
    "<run_dir>/logs/telescope.log); --enable_prompt_prefetch false prepares prompts inline",
}


class RunStageError(RuntimeError):
    """A part of the run failed; the message says which, at which step, and the fix when known."""


class StallError(RuntimeError):
    """No training step completed within ``stall_timeout_s``."""


def stage_error(stage: str, exc: BaseException, step: int | None = None) -> BaseException:
    """``RunStageError`` for ``exc`` raised in ``stage``; logs the full traceback (file logs only).

    The original exception is not chained (``describe_failure`` would unwrap down to it and
    drop the stage); its one-line description is part of the message instead.
    """
    from telescope.core.config import ConfigError

    if isinstance(exc, (RunStageError, ConfigError)):
        return exc  # already says where; a config error keeps its own type (exit code 2)
    where = f"step {step}: {stage}" if step is not None else stage
    log.info("%s failed", where, exc_info=exc)  # the traceback, for telescope.log (INFO, not the console)
    fix = next((f"; {fix}" for key, fix in _FIXES.items() if stage.startswith(key)), "")
    error = RunStageError(f"{where} failed: {describe_failure(exc)}{fix}")
    error.original = exc  # type: ignore[attr-defined]
    return error


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
