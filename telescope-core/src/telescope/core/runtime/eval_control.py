"""Evals around and during training, on inference servers the orchestrator lends out.

- Before training (``eval_before_training``, never on resume) and after it
  (``eval_after_training``): every server when ``eval_start_end_use_all_servers``, else the
  eval servers.
- Periodic evals (``eval_every``) run on the last ``eval_num_servers`` servers. At an eval
  step those servers have just loaded that step's weights; they are drained (their groups go
  back to the prompt queue) and *held*: later syncs reach them and are verified, but not
  applied, so the eval sees exactly the eval step's model while training goes on with the
  other servers. When the eval ends they are released, load the weights of the next sync, and
  take training rollouts again. An eval falling due while the previous one still runs waits
  for it (training pauses), as the eval servers must be up to date first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from telescope.core.errors import RunStageError, stage_error
from telescope.core.rollouts.outcomes import InfraRateError

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.evals.aggregate import EvalResult
    from telescope.core.evals.runner import EvalRunner
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.runtime.orchestrator import Orchestrator

__all__ = ["EvalController"]

log = logging.getLogger("telescope.evals")


class EvalController:
    """Schedules evals and moves the eval servers between training and evaluation."""

    def __init__(
        self,
        cfg: TelescopeConfig,
        runner: EvalRunner,
        clients: list[ServerClient],
        log_results: Callable[[int, list[EvalResult]], None],
    ) -> None:
        """``log_results(step, results)`` reports one eval round (the run: ``reporting.report_evals``)."""
        self.cfg = cfg
        self.runner = runner
        self.clients = clients
        self.log_results = log_results
        count = cfg.eval_num_servers if cfg.evals else 0
        self.eval_servers = set(range(len(clients) - count, len(clients))) if count else set()
        self._task: asyncio.Task[None] | None = None
        self._awaiting_sync = False
        self._report_failure: RunStageError | InfraRateError | None = None
        """A plugin failed on a periodic eval's results, or the eval took the run's infrastructure
        failure rate above ``infra_max_failure_rate``: raised at the next step (it ends the run)."""
        self.ran_at: dict[int, set[str]] = {}

    def _start_end_servers(self) -> list[int]:
        if self.cfg.eval_start_end_use_all_servers:
            return list(range(len(self.clients)))
        return sorted(self.eval_servers)

    async def _run(self, entries: list[Any], servers: list[int], step: int) -> None:
        if not entries:
            return
        if not servers:
            log.warning(
                "evals at step %d skipped: no server for them (eval_num_servers: 0 and "
                "eval_start_end_use_all_servers: false)",
                step,
            )
            return
        results = await self.runner.run(entries, [self.clients[i] for i in servers], step)
        self.ran_at.setdefault(step, set()).update(e.name for e in entries)
        try:
            self.log_results(step, results)
        except Exception as exc:  # noqa: BLE001 - a plugin's error ends the run, unlike a failed eval
            raise stage_error("the telescope_eval_end hook", exc, step) from None

    # --- around training -------------------------------------------------------------
    async def before_training(self, resumed: bool) -> None:
        """The baseline eval of every entry (step 0), unless this run resumes a checkpoint."""
        if self.cfg.evals and self.cfg.eval_before_training and not resumed:
            await self._run(list(self.cfg.evals), self._start_end_servers(), 0)

    async def after_training(self, orchestrator: Orchestrator) -> None:
        """Wait for a running eval, bring every server to the final weights, run the final evals."""
        if self._task is not None:
            await self._task
        self._raise_report_failure()
        if not (self.cfg.evals and self.cfg.eval_after_training):
            return
        step = orchestrator.counts.completed_steps
        servers = self._start_end_servers()
        if orchestrator.servers.last_sync_hold & set(servers) or self._awaiting_sync:
            orchestrator.servers.held_servers.clear()
            await orchestrator.servers.sync_weights(step)  # the held servers are behind: same version again
        done = self.ran_at.get(step, set())
        await self._run([e for e in self.cfg.evals if e.name not in done], servers, step)

    async def close(self) -> None:
        """Stop a running eval and release what the evals started (sandboxes, tools)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.runner.close()

    # --- during training ---------------------------------------------------------------
    async def after_step(self, orchestrator: Orchestrator, step: int) -> None:
        """Release eval servers that have caught up; start the evals due at ``step``."""
        self._raise_report_failure()
        if self._awaiting_sync and not (orchestrator.servers.last_sync_hold & self.eval_servers):
            self._awaiting_sync = False
            orchestrator.servers.restore(self.eval_servers)
        due = self.runner.due(step) if self.eval_servers else []
        if not due:
            return
        if self._task is not None and not self._task.done():
            log.info("eval step %d: waiting for the previous eval to finish", step)
            await self._task
            self._raise_report_failure()
        if orchestrator.servers.last_sync_hold & self.eval_servers:
            orchestrator.servers.held_servers.difference_update(self.eval_servers)
            await orchestrator.servers.sync_weights(step)  # they were held: bring them to this step's weights
        self._awaiting_sync = False
        await orchestrator.servers.drain(self.eval_servers)
        orchestrator.servers.held_servers.update(self.eval_servers)
        self._task = asyncio.create_task(self._periodic(orchestrator, due, step), name=f"eval-step-{step}")

    def _raise_report_failure(self) -> None:
        if self._report_failure is not None:
            raise self._report_failure

    async def _periodic(self, orchestrator: Orchestrator, entries: list[Any], step: int) -> None:
        try:
            await self._run(entries, sorted(self.eval_servers), step)
        except (RunStageError, InfraRateError) as exc:  # results not reported, or too many infra failures
            self._report_failure = exc
        except Exception as exc:  # noqa: BLE001 - a failed eval is reported, training goes on
            log.warning("evals at step %d failed: %s: %s", step, type(exc).__name__, exc)
        finally:
            # Released now; they load the next sync's weights, then take rollouts again.
            orchestrator.servers.held_servers.difference_update(self.eval_servers)
            self._awaiting_sync = True
