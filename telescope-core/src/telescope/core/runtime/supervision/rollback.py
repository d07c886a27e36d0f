"""The driver's side of a health rollback: the checkpoint to restart from and the lowered learning rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from telescope.core.errors import exception_chain
from telescope.core.health.findings import HealthRollback
from telescope.core.runtime.checkpointing import find_resume_point, supersede_later_checkpoints
from telescope.core.runtime.supervision.recovery import RestartPlan

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Rollback", "health_rollback"]


@dataclass(frozen=True)
class Rollback:
    """Restart from ``plan.point`` with ``cfg`` (the run's config at the lowered learning rate)."""

    plan: RestartPlan
    cfg: TelescopeConfig


def health_rollback(exc: BaseException, cfg: TelescopeConfig) -> Rollback | None:
    """When ``exc`` is (or wraps) a ``HealthRollback``: its checkpoint as a restart point, the later
    checkpoints set aside (they belong to the abandoned history), and ``cfg`` at its learning rate."""
    rollback = next((e for e in exception_chain(exc) if isinstance(e, HealthRollback)), None)
    if rollback is None:
        return None
    lowered = cfg.model_copy(update={"learning_rate": rollback.learning_rate})
    point = find_resume_point(lowered.model_copy(update={"resume_from_checkpoint": rollback.step}))
    assert point is not None  # resume_from_checkpoint is a step number
    supersede_later_checkpoints(lowered, point)
    return Rollback(RestartPlan(point, str(rollback)), lowered)
