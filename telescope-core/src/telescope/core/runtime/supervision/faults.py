"""The run's fault seams (``TELESCOPE_FAULTS``, ``telescope.core.faults``), installed at assembly.

Nothing here runs unless the variable is set: the driver calls ``install_faults`` once on the
assembled orchestrator, each trainer rank ``with_trainer_faults`` once on its backend, and the
rest of the runtime has no fault checks. The seams of the layers below are installed the same
way: clients (``inference/faults.py``) and environments (``env/faults.py``, by ``env.resolve``).

- ``request_fail``, ``server_slow``: the orchestrator's clients are wrapped (``FaultyClient``).
- ``prompt_raise``: the prompt source's preparation counts prompts and raises at the N-th,
  inside ``PromptSource.prepare`` (the failure names the environment and sample as a real one).
- ``server_kill``: a step hook, first of the orchestrator's, SIGKILLs server 0 after step N.
- ``train_step_raise``: each trainer rank's backend raises in step N (``with_trainer_faults``).
- ``train_loss_nan``: each trainer rank's backend trains step N on NaN advantages (same wrapper).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from telescope.core import faults
from telescope.core.inference.faults import with_request_faults

if TYPE_CHECKING:
    from telescope.core.rollouts.prompts import PromptSource
    from telescope.core.runtime.orchestrator import Orchestrator
    from telescope.core.trainer import RankBatch, TrainerBackend

__all__ = ["ServerKill", "install_faults", "with_trainer_faults"]


def install_faults(orchestrator: Orchestrator) -> None:
    """Install the driver's seams on an assembled orchestrator (before its step hooks are added)."""
    if faults.current() is None:
        return
    orchestrator.clients = with_request_faults(orchestrator.clients)
    _count_prompts(orchestrator.prompts)
    orchestrator.hooks.insert(0, ServerKill())


def _count_prompts(prompts: PromptSource) -> None:
    """``prompt_raise@N``: the N-th preparation of the run raises (counted across prefetch threads)."""
    prepare, count = prompts._prepare, itertools.count(1)

    def faulty(item: Any) -> Any:
        faults.on_prepare_prompt(next(count))
        return prepare(item)

    prompts._prepare = faulty  # type: ignore[method-assign]


class ServerKill:
    """``server_kill@N``: after step N (its metrics reported), inference server 0 is SIGKILLed."""

    async def after_step(self, orchestrator: Orchestrator, step: int) -> None:
        server = faults.kill_server_after(step)
        if server is not None and orchestrator.servers.healer is not None:
            await orchestrator.servers.healer.kill(server)


class _FaultyBackend:
    """A trainer backend whose ``train_step`` first goes through ``faults.on_train_step``."""

    def __init__(self, backend: TrainerBackend) -> None:
        self.backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def train_step(self, batch: RankBatch) -> dict[str, float]:
        faults.on_train_step(batch.step + 1)
        if faults.nan_loss_in(batch.step + 1):
            for row in batch.micro_batches:
                row.advantages = [math.nan] * len(row.advantages)
        return self.backend.train_step(batch)


def with_trainer_faults(backend: TrainerBackend) -> TrainerBackend:
    """A trainer rank's backend, wrapped when ``TELESCOPE_FAULTS`` is set (``train_step_raise``,
    ``train_loss_nan``)."""
    if faults.current() is None:
        return backend
    return _FaultyBackend(backend)  # type: ignore[return-value]
