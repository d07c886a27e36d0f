"""A raised finding, and the errors through which ``stop`` and ``rollback`` end a run session."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from telescope.core.errors import RunStageError

__all__ = ["Finding", "HealthRollback", "HealthStop"]


@dataclass(frozen=True)
class Finding:
    """One finding: which rule, when, the evidence, and what the run does about it."""

    name: str
    step: int
    """The step at which it was raised (its patience reached)."""
    onset: int
    """The first anomalous step of its window."""
    evidence: str
    action: str
    time: float = field(default_factory=time.time)

    def line(self) -> str:
        """``health: <name> at step N: <evidence>``."""
        window = f" (anomalous since step {self.onset})" if self.onset != self.step else ""
        return f"health: {self.name} at step {self.step}{window}: {self.evidence}"

    def record(self) -> dict[str, Any]:
        """JSON-ready, for ``run.json``'s ``info.health.findings``."""
        return asdict(self)


class HealthStop(RunStageError):
    """A finding whose action is ``stop`` (or a ``rollback`` that could not be made) ends the run.

    A ``RunStageError``, so the step hook that raises it is not named in front of its message: the
    message is the one line the run ends with.
    """

    complete_reason = True


class HealthRollback(RunStageError):
    """A finding whose action is ``rollback``: the driver restarts the run from ``step``'s checkpoint
    with ``learning_rate`` (``runtime.supervision.rollback``)."""

    complete_reason = True

    def __init__(self, message: str, step: int, learning_rate: float) -> None:
        super().__init__(message)
        self.step = step
        self.learning_rate = learning_rate
