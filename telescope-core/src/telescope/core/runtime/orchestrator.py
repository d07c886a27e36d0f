"""The orchestrator: stream prompts to servers, score, batch, train, sync weights — overlapped.

Counters (the seed semantics, with ``model_version`` = trainer steps whose weights the
servers hold, 0 = the initial model):

- ``inference_step``: batches handed to the trainer so far;
- a new group starts only while it is needed for a batch that may be generated with the
  current weights: batches ``< model_version + max_async_rollout + 1``. With
  ``max_async_rollout: 0`` every batch is generated entirely by the latest weights;
- after each weight update, samples still *generating* that were dispatched more than
  ``max_off_policy_steps`` versions ago are cancelled — the task and the request on the
  server (cancel reason ``off_policy``); scoring does not age a sample;
- when a batch is cut, a group whose oldest sample started more than ``max_async_rollout``
  versions before the batch's step is discarded (reason ``max_async``).

Liveness: a failure in any task of the run (trainer loop, prompt prefetch, rollout tasks)
ends ``run`` at once with a ``RunStageError`` naming the stage; with ``stall_timeout_s`` set,
the watchdog fails a run that completes no step for that long (``supervision/liveness.py``,
from ``snapshot()``). Weight syncs and healing: ``self.servers`` (``supervision/servers.py``).
One sample's run and outcome (an infrastructure failure retried or masked, never scored):
``sample_run.py`` and ``rollouts/outcomes.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from telescope.core.errors import stage_error
from telescope.core.rollouts.batching import BatchBuilder, GroupBucket, TrainBatch
from telescope.core.rollouts.groups import RolloutGroup, zero_advantage_kind
from telescope.core.rollouts.inflight import InflightGroup, RunningSample
from telescope.core.rollouts.lanes import Lanes, QueuedSample
from telescope.core.rollouts.outcomes import InfraLedger, InfraPolicy
from telescope.core.rollouts.prompts import PromptSource
from telescope.core.rollouts.rollout import RolloutRunner
from telescope.core.runtime import sandbox_report
from telescope.core.runtime.events import EventQueue
from telescope.core.runtime.reporting import StepRollouts
from telescope.core.runtime.sample_run import run_sample
from telescope.core.runtime.step_metrics import Counts, routing_metrics, step_metrics
from telescope.core.runtime.supervision import liveness
from telescope.core.runtime.supervision.servers import InferenceSupervisor, WeightBroadcaster
from telescope.core.runtime.supervision.stall import FailureStreaks

if TYPE_CHECKING:
    import pluggy

    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.server_client import ServerClient

__all__ = ["Counts", "Orchestrator", "StepHook", "TrainerHandle"]

log = logging.getLogger("telescope.orchestrator")

ABORT_TIMEOUT_S = 10.0
"""An abort of a cancelled group's requests that takes longer is given up (the server is frozen)."""


class TrainerHandle(WeightBroadcaster, Protocol):
    """What the orchestrator needs from the trainer side (``RayTrainerGroup`` in production)."""

    dp_world_size: int

    async def train_step(self, step: int, batch: TrainBatch) -> dict[str, float]: ...


class StepHook(Protocol):
    """Runs after each step's weight sync, before the next step trains (checkpoints, evals)."""

    async def after_step(self, orchestrator: Orchestrator, step: int) -> None: ...


class Orchestrator:
    """One run's rollout/training loop (asyncio, in the driver process)."""

    progress_every_s: float = 10.0
    """While no step completes, a line with the discards since the last step at most this often."""

    def __init__(
        self,
        cfg: TelescopeConfig,
        prompts: PromptSource,
        runner: RolloutRunner,
        clients: list[ServerClient],
        trainer: TrainerHandle,
        batches: BatchBuilder,
        hook: pluggy.HookRelay,
    ) -> None:
        """``hook``: the plugin manager's hooks (``pm.hook``); the run reports through them only."""
        self.cfg = cfg
        self.prompts = prompts
        self.runner = runner
        self.clients = clients
        self.trainer = trainer
        self.batches = batches
        self.hook = hook
        self.rollouts = StepRollouts()
        self.counts = Counts()
        self.individual = cfg.enable_individual_sample_lanes
        self.lanes = Lanes(len(clients), cfg.max_concurrent_prompts_per_server * cfg.group_size)
        self.servers = InferenceSupervisor(self, cfg, self.lanes)
        self.hooks: list[StepHook] = []
        self._groups: dict[int, InflightGroup] = {}
        self._bucket = GroupBucket(cfg.prompts_batch_size_for_trainer, cfg.max_async_rollout)
        self._batches: asyncio.Queue[TrainBatch] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._step_started = time.time()
        self._fatal: BaseException | None = None
        self._stage, self._stage_since = "starting", time.time()
        """What the trainer loop is doing now (named in failures and in the stall dump)."""
        self._failures = FailureStreaks.for_batch_size(cfg.prompts_batch_size_for_trainer)
        """An environment whose every group fails would never train: it ends the run (stall.py)."""
        self._discards = liveness.DiscardTally()
        self.infra = InfraLedger(InfraPolicy.from_config(cfg))
        """Samples' infrastructure failures: retried, masked, counted (``rollouts/outcomes.py``)."""
        self.events = EventQueue(hook, lambda: self.counts.inference_step + 1, self.fail)
        self.event, self.emit, self.flush_events = self.events.event, self.events.emit, self.events.flush

    def state_dict(self) -> dict[str, Any]:
        """Counters and prompt ledger, taken between two awaits (so they agree with each other)."""
        counts = {**self.counts.state_dict(), "infra": self.infra.state_dict()}
        return {"counts": counts, "prompts": self.prompts.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a checkpointed run (before ``run()``)."""
        self.counts = Counts.from_state(state["counts"])
        self.infra.load_state_dict(state["counts"].get("infra", {}))
        self.prompts.load_state_dict(state["prompts"])

    # --- main loop ---------------------------------------------------------------------
    async def run(self) -> Counts:
        """Run until ``number_of_steps`` training steps are done; any failure ends the run at once."""
        self._step_started = time.time()  # evals before training do not count as a stalled step
        trainer_task = self.spawn(self._trainer_loop(), "trainer loop")
        watch = liveness.watchdog(self.snapshot, self.fail, self.cfg.stall_timeout_s, self.progress_every_s)
        watchdog_task = self.spawn(watch, "watchdog")
        server_watch = self.spawn(self.servers.watch(self.snapshot), "inference server watch")
        try:
            await self.prompts.start(on_failure=lambda exc: self.fail(stage_error("prompt prefetch", exc)))
            while not trainer_task.done():
                self._raise_if_failed()
                await self._start_groups()
                self._dispatch_queued()
                await self._wake.wait()
                self._wake.clear()
            self._raise_if_failed()
            trainer_task.result()
        finally:
            watchdog_task.cancel()
            server_watch.cancel()
            await self._shutdown(trainer_task)
            fatal = self._fatal
            self.flush_events()  # the last events: cancelled samples' spans
        if self._fatal is not fatal and self._fatal is not None:  # a plugin failed on them: not quietly
            raise self._fatal
        return self.counts

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task of the run: if it raises, the run ends naming ``name``."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(lambda t: self._check_task(t, name))
        return task

    def _check_task(self, task: asyncio.Task[Any], stage: str) -> None:
        """A task that raised ends the run (wakes the main loop, which raises)."""
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            self.poke()  # a finished trainer loop ends the main loop
        else:
            self.fail(stage_error(stage, exc))

    def fail(self, error: BaseException) -> None:
        """End the run with ``error`` (the first one given wins)."""
        if self._fatal is None:
            self._fatal = error
        self.poke()

    def _raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _report_group(self, group: RolloutGroup) -> None:
        """A group is done with (kept in the batch being cut, discarded, or cancelled)."""
        step = self.counts.inference_step + 1
        self.rollouts.add(group, step)
        self.hook.telescope_group_end(group=group, step=step)

    def poke(self) -> None:
        """Wake the main loop (a lane, a group or a batch changed)."""
        self._wake.set()

    async def _shutdown(self, trainer_task: asyncio.Task[Any]) -> None:
        await self.prompts.stop()
        for gid in list(self._groups):
            await self._cancel_group(gid, reason=None)
        if not trainer_task.done():
            trainer_task.cancel()
        await asyncio.gather(trainer_task, return_exceptions=True)

    def snapshot(self) -> liveness.RunSnapshot:
        """What every server, lane and group is doing now (the watchdog and its stall dump)."""
        counts, cfg = self.counts, self.cfg
        return liveness.RunSnapshot(
            counts.completed_steps,
            cfg.number_of_steps,
            counts.inference_step,
            counts.model_version,
            self._stage,
            self._stage_since,
            self._step_started,
            len(self._bucket),
            cfg.prompts_batch_size_for_trainer,
            self._batches.qsize(),
            self._discards.summary(),
            [liveness.ServerState.of(self.lanes, i) for i in range(self.lanes.num_servers)],
            [liveness.GroupState.of(g) for _, g in sorted(self._groups.items())],
        )

    # --- starting groups ---------------------------------------------------------------
    def _groups_wanted(self) -> int:
        allowed = min(self.cfg.number_of_steps, self.counts.model_version + self.cfg.max_async_rollout + 1)
        batches_open = max(0, allowed - self.counts.inference_step)
        return batches_open * self.cfg.prompts_batch_size_for_trainer - len(self._bucket) - len(self._groups)

    async def _start_groups(self) -> None:
        need = 1 if self.individual else self.cfg.group_size
        while self._groups_wanted() > 0:
            server = self.lanes.pick_server(need)
            if server is None:
                return
            prepared = await self.prompts.next()
            gid, size = prepared.item.group_id, self.cfg.group_size
            self._groups[gid] = InflightGroup(prepared, server, [None] * size)
            for index in range(size):
                self.lanes.enqueue(server, QueuedSample(gid, index))

    def _dispatch_queued(self) -> None:
        for ready in self.lanes.pop_ready():
            gid, index, version = ready.sample.group_id, ready.sample.index, self.counts.model_version
            group = self._groups.get(gid)
            if group is None:
                self.lanes.release(ready.server, ready.slot)
                continue
            sample = group.sample_task(index, ready.slot, lambda: self.counts.model_version, self.cfg.seed)
            name = f"the rollout task of group {gid} sample {index}"
            task = self.spawn(run_sample(self, group, index, sample), name)
            group.running[index] = RunningSample(task, sample, version)

    # --- groups -> batches ----------------------------------------------------------------
    def is_inflight(self, group: InflightGroup) -> bool:
        """``group`` is still being generated (not completed, cancelled or served again)."""
        return self._groups.get(group.group_id) is group

    def complete_group(self, group: InflightGroup) -> None:
        """Every sample of ``group`` finished or failed: discard it, or keep it for a batch."""
        self._groups.pop(group.group_id, None)
        done = group.complete(self.counts.model_version)
        self.counts.reward_errors[done.env_name] += group.reward_errors
        stalled = self._failures.record(done.env_name, group.failure)
        if stalled is not None:
            self.fail(stalled)
        if done.discard_reason is None:
            self.batches.assign_advantages(done)
            kind = zero_advantage_kind(done.rewards)
            if kind is not None and self.cfg.discard_group_zero_advantage and self.cfg.group_size > 1:
                done.discard_reason, done.zero_advantage_kind = "zero_advantage", kind
                self.counts.zero_advantage[kind] += 1
        if done.discard_reason is not None:
            self._discard(done)
        else:
            self._bucket.add(done)  # reported when it goes into a batch (or is discarded there)
        self._cut_batches()

    def _discard(self, group: RolloutGroup) -> None:
        assert group.discard_reason is not None
        self.counts.discarded[group.discard_reason] += 1
        kind = f"/{group.zero_advantage_kind}" if group.zero_advantage_kind else ""
        self._discards.add(group.discard_reason + kind, group.env_name)
        self.prompts.resolve([group.group_id])
        self._report_group(group)

    def _cut_batches(self) -> None:
        while self.counts.inference_step < self.cfg.number_of_steps:
            for group in self._bucket.drop_too_old(self.counts.inference_step):
                self._discard(group)
            groups = self._bucket.take()
            if groups is None:
                return
            batch = self.batches.build(groups, self.trainer.dp_world_size, self.counts.inference_step)
            for group in groups:
                self._report_group(group)
            self._batches.put_nowait(batch)  # batch.step == inference_step
            self.counts.inference_step += 1

    async def _cancel_group(self, gid: int, reason: str | None, requeue: bool = False) -> None:
        """Cancel a running group: ``reason`` counts it as discarded; ``requeue`` serves its prompt again."""
        dropped = self._drop_group(gid, reason, requeue)
        if dropped is not None:
            await self._abort(*dropped)

    def _drop_group(self, gid: int, reason: str | None, requeue: bool) -> tuple[int, list[str]] | None:
        """``_cancel_group`` without the abort (no await): its server and the request ids to abort."""
        group = self._groups.pop(gid, None)
        if group is None:
            return None
        if requeue:
            self.prompts.requeue([group.prepared.item])
        self.lanes.drop_group(gid)
        ids = group.cancel()
        if reason is not None:
            self.counts.cancelled_samples += len(ids)
            self._discard(group.cancelled(self.counts.model_version, reason, len(ids)))
        return group.server, ids

    async def _abort(self, server: int, ids: list[str]) -> None:
        if not ids:
            return
        try:
            # bounded: a frozen server never answers, and its abort would hold the run's shutdown
            # for the client's hour
            abort = self.clients[server].abort(ids)
            self.counts.aborted_requests += await asyncio.wait_for(abort, timeout=ABORT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the closed connection already aborts it
            log.debug("abort of %s failed: %s", ids, exc)

    async def requeue_groups(self, servers: set[int]) -> int:
        """Cancel the groups on ``servers`` and serve their prompts again (same group ids).

        Every group is cancelled before the first abort is awaited: none of them completes
        meanwhile (a server being restarted gives back all its groups, never some)."""
        gids = [gid for gid, g in self._groups.items() if g.server in servers]
        dropped = [d for gid in gids if (d := self._drop_group(gid, None, requeue=True)) is not None]
        for server, ids in dropped:
            await self._abort(server, ids)
        return len(gids)

    async def _cancel_stale(self) -> None:
        """Cancel groups with a sample still generating that was dispatched too many versions ago."""
        limit, version = self.cfg.max_off_policy_steps, self.counts.model_version
        for gid in [gid for gid, g in self._groups.items() if g.is_stale(version, limit)]:
            await self._cancel_group(gid, reason="off_policy")

    # --- trainer side ------------------------------------------------------------------
    def _enter(self, stage: str) -> None:
        self._stage, self._stage_since = stage, time.time()

    async def _trainer_loop(self) -> None:
        step = self.counts.completed_steps
        try:
            while self.counts.completed_steps < self.cfg.number_of_steps:
                self._enter("waiting for a batch")
                waited = time.time()
                batch = await self._batches.get()
                self._raise_if_failed()  # a run that failed trains on nothing more (main loop may not have woken yet)
                step = batch.step
                await self._train_one(step, batch, time.time() - waited)
        except Exception as exc:  # noqa: BLE001 - re-raised with the stage and step named
            raise stage_error(self._stage, exc, step + 1) from None

    async def _train_one(self, step: int, batch: TrainBatch, waited_s: float) -> None:
        self._enter("train_step")
        self.event("trainer", "start", step=step + 1, name="train_step")
        metrics = await self.trainer.train_step(step, batch)
        self.servers.trained_version = step + 1
        self.prompts.resolve([g.group_id for g in batch.groups])
        self.event("trainer", "end", step=step + 1, name="train_step")
        self._enter("weight sync")
        sync = await self.servers.sync_weights(step + 1)
        self.counts.model_version = step + 1
        await self._cancel_stale()
        self.counts.completed_steps = step + 1
        now = time.time()
        timing = {"timing_step_total": now - self._step_started, "timing_waiting_for_data": waited_s}
        self._step_started = now
        self._discards.reset()
        self._enter("the telescope_step_end hook")
        report = step_metrics(self.counts, batch, metrics, sync, timing) | self.infra.step_metrics()
        report |= routing_metrics(self.runner.router)
        report |= sandbox_report.drain(self.emit, step + 1, int(batch.metrics.get("batch/num_samples", 0)))
        rows = self.rollouts.close(step + 1, report)
        self.flush_events()  # the step's events reach the hooks before its metrics
        self.hook.telescope_step_end(step=step + 1, metrics=report, rollouts=rows)
        self.poke()
        for hook in self.hooks:
            self._enter(f"step hook {type(hook).__name__}")
            await hook.after_step(self, step + 1)
