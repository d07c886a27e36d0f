"""The run's side of a health finding's ``stop`` or ``rollback``: an orchestrator step hook that, after
a step whose finding asks for it, saves the step's checkpoint (stop) and ends the session with the
sentinel's error (``HealthStop``, or ``HealthRollback`` for the driver to restart on: ``supervision.rollback``).
The rules and their findings live in ``telescope.core.health``; acting needs the run's objects, so it is here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telescope.core.runtime.checkpointing import RunCheckpointer
from telescope.core.runtime.ray_group import RayTrainerGroup

if TYPE_CHECKING:
    from telescope.core.health.sentinel import HealthSentinel
    from telescope.core.runtime.orchestrator import Orchestrator
    from telescope.core.runtime.session import RunSession

__all__ = ["HealthActions"]


class HealthActions:
    """After a step whose finding says ``stop`` or ``rollback``: checkpoint (stop), then end the session."""

    def __init__(self, sentinel: HealthSentinel, session: RunSession) -> None:
        self.sentinel, self.session = sentinel, session

    async def after_step(self, orchestrator: Orchestrator, step: int) -> None:
        finding = self.sentinel.take_pending()
        if finding is None:
            return
        target, why_not = self.sentinel.rollback_target(finding)
        if target is not None:
            raise self.sentinel.rollback(finding, target)
        saved = await self._checkpoint(orchestrator, step)
        raise self.sentinel.stop(finding, f"checkpoint: {saved}", why_not)

    async def _checkpoint(self, orchestrator: Orchestrator, step: int) -> str:
        """The step's checkpoint (already saved when ``checkpoint_every`` was due), or why none."""
        checkpointer = next((h for h in orchestrator.hooks if isinstance(h, RunCheckpointer)), None)
        if checkpointer is None:  # checkpoint_every off: this one save still goes where it would
            trainer, warn = orchestrator.trainer, self.sentinel.hook.telescope_warning
            assert isinstance(trainer, RayTrainerGroup)
            checkpointer = RunCheckpointer(
                self.session.cfg, trainer, self.session.logger_ids, lambda m: warn(message=m)
            )
        if step in checkpointer.mgr.steps():
            return str(checkpointer.mgr.path(step))
        path = await checkpointer.checkpoint(orchestrator, step)
        return str(path) if path is not None else "the checkpoint could not be written"
