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
a run that completes no step for that long logs what everything is doing and fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from telescope.core.observe.records import TimelineEvent
from telescope.core.runtime import faults
from telescope.core.runtime.batching import BatchBuilder, TrainBatch
from telescope.core.runtime.groups import (
    GroupFailure,
    RolloutGroup,
    RolloutSample,
    reward_failed,
    zero_advantage_kind,
)
from telescope.core.runtime.healing import ServerRestartsExhaustedError
from telescope.core.runtime.lanes import Lanes, QueuedSample
from telescope.core.runtime.liveness import DiscardTally, StallError, stage_error
from telescope.core.runtime.prompts import PreparedPrompt, PromptSource
from telescope.core.runtime.reporting import StepRollouts
from telescope.core.runtime.rollout import PromptTooLongError, RolloutRunner, SampleTask, request_seed
from telescope.core.runtime.stall import FailureStreaks
from telescope.core.runtime.step_metrics import step_metrics
from telescope.core.weights.errors import StaleWeightsError

if TYPE_CHECKING:
    import pluggy

    from telescope.core.config import TelescopeConfig

__all__ = ["Orchestrator", "TrainerHandle"]

log = logging.getLogger("telescope.orchestrator")


class TrainerHandle(Protocol):
    """What the orchestrator needs from the trainer side (Ray actors in production)."""

    dp_world_size: int

    async def train_step(self, step: int, batch: Any) -> dict[str, float]: ...

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, Any]: ...


class StepHook(Protocol):
    """Runs after each step's weight sync, before the next step trains (checkpoints, evals)."""

    async def after_step(self, orchestrator: Orchestrator, step: int) -> None: ...


@dataclass
class _Running:
    """One dispatched sample: its task and request, and whether the model is still generating it."""

    task: asyncio.Task[Any]
    request_id: str
    slot: int
    version: int
    """``model_version`` when it was dispatched."""
    started: float = field(default_factory=time.time)
    generating: bool = True


@dataclass
class _Group:
    prepared: PreparedPrompt
    server: int
    results: list[RolloutSample | None]
    running: dict[int, _Running] = field(default_factory=dict)
    finished: int = 0
    failure: GroupFailure | None = None


@dataclass
class Counts:
    """Run-wide counters (also what a resume needs)."""

    inference_step: int = 0
    model_version: int = 0
    completed_steps: int = 0
    discarded: Counter[str] = field(default_factory=Counter)
    zero_advantage: Counter[str] = field(default_factory=Counter)
    cancelled_samples: int = 0
    rollout_errors: int = 0
    reward_errors: Counter[str] = field(default_factory=Counter)
    """Samples whose reward raised or timed out, per environment."""
    inference_restarts: int = 0
    """Inference servers restarted after they died."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready counters (a checkpoint's ``orchestrator_state.json``)."""
        return {"model_version": self.model_version, "completed_steps": self.completed_steps,
                "discarded": dict(self.discarded), "zero_advantage": dict(self.zero_advantage),
                "cancelled_samples": self.cancelled_samples, "rollout_errors": self.rollout_errors,
                "reward_errors": dict(self.reward_errors), "inference_restarts": self.inference_restarts}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Counts:
        """Counters of a resumed run: batches after the checkpoint's step are generated again."""
        step = int(state["completed_steps"])
        return cls(inference_step=step, model_version=int(state["model_version"]), completed_steps=step,
                   discarded=Counter(state["discarded"]), zero_advantage=Counter(state["zero_advantage"]),
                   cancelled_samples=int(state["cancelled_samples"]), rollout_errors=int(state["rollout_errors"]),
                   reward_errors=Counter(state.get("reward_errors", {})),
                   inference_restarts=int(state.get("inference_restarts", 0)))  # fmt: skip


class Orchestrator:
    """One run's rollout/training loop (asyncio, in the driver process)."""

    progress_every_s: float = 10.0
    """While no step completes, a line with the discards since the last step at most this often."""

    def __init__(
        self, cfg: TelescopeConfig, prompts: PromptSource, runner: RolloutRunner, clients: list[Any],
        trainer: TrainerHandle, batches: BatchBuilder, hook: pluggy.HookRelay,
    ) -> None:  # fmt: skip
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
        per_server = cfg.max_concurrent_prompts_per_server
        self.individual = cfg.enable_individual_sample_lanes
        self.lanes = Lanes(len(clients), per_server * cfg.group_size)
        self._groups: dict[int, _Group] = {}
        self._bucket: list[RolloutGroup] = []
        self._batches: asyncio.Queue[TrainBatch] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._step_started = time.time()
        self._wait_for_data_s = 0.0
        self._fatal: BaseException | None = None
        self._stage = "starting"
        """What the trainer loop is doing now (named in failures and in the stall dump)."""
        self._stage_since = time.time()
        # A run whose every group of an environment fails (prompts too long for max_model_len, a
        # broken server, a reward that always raises) would never train on it: end it after
        # this many failed groups of one environment in a row.
        self._failures = FailureStreaks(max(200, 4 * cfg.prompts_batch_size_for_trainer))
        self._discards = DiscardTally()
        self.hooks: list[StepHook] = []
        self.tokenizer: Any = None
        self.held_servers: set[int] = set()
        """Servers kept at older weights (eval servers): later syncs reach them without applying."""
        self.last_sync_hold: frozenset[int] = frozenset()
        """The servers the latest sync did not apply to."""
        self.healer: Any = None
        """Restarts dead inference servers (``healing.RayServerHealer``); None: a dead server fails the run."""
        self._sync_lock = asyncio.Lock()  # a weight sync and a server restart never overlap
        self._healing: set[int] = set()
        """Servers found dead: drained, being restarted or waiting for their first sync."""
        self._restarts: Counter[int] = Counter()
        self._dropped: set[int] = set()
        """Servers that died more than ``inference_max_restarts`` times while others remained."""
        self._trained_version = 0

    def state_dict(self) -> dict[str, Any]:
        """Counters and prompt ledger, taken between two awaits (so they agree with each other)."""
        return {"counts": self.counts.state_dict(), "prompts": self.prompts.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a checkpointed run (before ``run()``)."""
        self.counts = Counts.from_state(state["counts"])
        self.prompts.load_state_dict(state["prompts"])

    # --- main loop ---------------------------------------------------------------------
    async def run(self) -> Counts:
        """Run until ``number_of_steps`` training steps are done; any failure ends the run at once."""
        self._step_started = time.time()  # evals before training do not count as a stalled step
        trainer_task = self._spawn(self._trainer_loop(), "trainer loop")
        watchdog = self._spawn(self._watchdog(), "watchdog")
        try:
            await self.prompts.start(on_failure=lambda exc: self._fail(stage_error("prompt prefetch", exc)))
            while not trainer_task.done():
                self._raise_if_failed()
                await self._start_groups()
                self._dispatch_queued()
                await self._wake.wait()
                self._wake.clear()
            self._raise_if_failed()
            trainer_task.result()
        finally:
            watchdog.cancel()
            await self._shutdown(trainer_task)
        return self.counts

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(lambda t: self._check_task(t, name))
        return task

    def _check_task(self, task: asyncio.Task[Any], stage: str) -> None:
        """A task that raised ends the run (wakes the main loop, which raises)."""
        if task.cancelled() or task.exception() is None:
            self._poke()  # a finished trainer loop ends the main loop
            return
        exc = task.exception()
        assert exc is not None
        self._fail(stage_error(stage, exc))

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        self._poke()

    def _raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _event(self, kind: str, phase: str, **fields: Any) -> None:
        fields.setdefault("step", self.counts.inference_step + 1)
        try:
            self.hook.telescope_event(event=TimelineEvent.of(kind, phase, **fields))
        except Exception as exc:  # noqa: BLE001 - a plugin's error ends the run (hookspecs.py), named as
            # such: raised inside a sample's request it would be counted as a failed rollout instead
            self._fail(stage_error("the telescope_event hook", exc, fields["step"]))

    def _report_group(self, group: RolloutGroup) -> None:
        """A group is done with (kept in the batch being cut, discarded, or cancelled)."""
        step = self.counts.inference_step + 1
        self.rollouts.add(group, step)
        self.hook.telescope_group_end(group=group, step=step)

    def _poke(self) -> None:
        self._wake.set()

    async def _shutdown(self, trainer_task: asyncio.Task[Any]) -> None:
        await self.prompts.stop()
        for gid in list(self._groups):
            await self._cancel_group(gid, reason=None)
        if not trainer_task.done():
            trainer_task.cancel()
        await asyncio.gather(trainer_task, return_exceptions=True)

    # --- watchdog --------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        """Fails a run with no step for ``stall_timeout_s``; says why no batch fills meanwhile."""
        stall = float(self.cfg.stall_timeout_s)
        tick = min(self.progress_every_s, stall) if stall > 0 else self.progress_every_s
        last_line = time.time()
        while True:
            await asyncio.sleep(max(0.05, tick / 4))
            now = time.time()
            idle = now - self._step_started
            if stall > 0 and idle > stall:
                for line in describe_state(self):
                    log.error("%s", line)
                self._fail(StallError(
                    f"no training step completed for {idle:.0f}s (stall_timeout_s={stall:g}) while "
                    f"waiting for step {self.counts.completed_steps + 1}, the trainer loop in '{self._stage}': "
                    "what every server, lane and group was doing is in <run_dir>/logs/telescope.log; "
                    "raise stall_timeout_s for steps this slow, 0 turns the watchdog off"))  # fmt: skip
                return
            if self._discards and idle >= self.progress_every_s and now - last_line >= self.progress_every_s:
                last_line = now
                log.warning(
                    "no batch for step %d yet after %.0fs (%d of %d groups collected); discarded since the "
                    "last step: %s", self.counts.inference_step + 1, idle, len(self._bucket),
                    self.cfg.prompts_batch_size_for_trainer, self._discards.summary(),
                )  # fmt: skip

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
            self._start_group(prepared, server)

    def _start_group(self, prepared: PreparedPrompt, server: int) -> None:
        gid = prepared.item.group_id
        group = _Group(prepared, server, [None] * self.cfg.group_size)
        self._groups[gid] = group
        for index in range(self.cfg.group_size):
            self.lanes.enqueue(server, QueuedSample(gid, index))

    def _dispatch_queued(self) -> None:
        for ready in self.lanes.pop_ready():
            server, slot, queued = ready.server, ready.slot, ready.sample
            group = self._groups.get(queued.group_id)
            if group is None:
                self.lanes.release(server, slot)
                continue
            request_id = f"g{queued.group_id}-s{queued.index}-v{self.counts.model_version}"
            task = self._spawn(self._run_sample(group, queued.index, server, slot, request_id),
                               f"the rollout task of group {queued.group_id} sample {queued.index}")  # fmt: skip
            group.running[queued.index] = _Running(task, request_id, slot, self.counts.model_version)

    # --- one sample --------------------------------------------------------------------
    async def _run_sample(self, group: _Group, index: int, server: int, slot: int, request_id: str) -> None:
        freed = generated = False
        p = group.prepared
        where = {"group_id": p.item.group_id, "sample_id": index, "server": server, "lane": slot}
        version = self.counts.model_version

        def on_generated() -> None:  # generation over (all turns), the reward comes next
            nonlocal freed, generated
            generated = True
            running = group.running.get(index)
            if running is not None:
                running.generating = False  # scoring does not age a sample (max_off_policy_steps)
            self._event("generation", "end", **where)
            self._event("reward", "start", group_id=p.item.group_id, sample_id=index)
            if not freed and self.cfg.free_lane_after_generation and self.individual:
                freed = True
                self.lanes.release(server, slot)
                self._poke()

        self._event("generation", "start", **where)
        task = SampleTask(request_id, p.env, p.sample, p.prompt_ids, p.prompt_text, p.reward_min, p.reward_max,
                          server, slot, lambda: self.counts.model_version,
                          request_seed(self.cfg.seed, p.item.group_id, index))  # fmt: skip
        try:
            result = await self.runner.run(self.clients[server], task, on_generated)
            group.results[index] = result
        except asyncio.CancelledError:
            raise
        except PromptTooLongError as exc:
            group.failure = group.failure or GroupFailure("prompt_too_long", str(exc))
            group.results[index] = _failed_sample(p, server, slot, version, str(exc))
        except StaleWeightsError as exc:  # sampled with weights it was not synced to: never train on it
            self._fail(exc)
            return
        except Exception as exc:  # noqa: BLE001 - a failed request discards its group, the run goes on
            if await self._server_lost(server):
                return  # not the sample's fault: its group is re-queued when the server is drained
            self.counts.rollout_errors += 1
            message = f"{type(exc).__name__}: {exc}"
            group.failure = group.failure or GroupFailure("rollout_error", message)
            group.results[index] = _failed_sample(p, server, slot, version, message)
            log.warning("rollout of group %d sample %d failed: %s", p.item.group_id, index, message)
        finally:
            if not freed:
                self.lanes.release(server, slot)
            group.running.pop(index, None)
            if generated:
                self._event("reward", "end", group_id=p.item.group_id, sample_id=index)
            else:  # failed or cancelled while generating
                self._event("generation", "end", **where)
        group.finished += 1
        if group.finished == self.cfg.group_size:
            self._complete_group(group)
        self._poke()

    # --- groups -> batches ----------------------------------------------------------------
    def _complete_group(self, group: _Group) -> None:
        item = group.prepared.item
        self._groups.pop(item.group_id, None)
        samples = [s for s in group.results if s is not None]
        done = RolloutGroup(item.group_id, item.env_name, item.sample_idx, samples, self.counts.model_version)
        errored = [s for s in samples if reward_failed(s)]
        self.counts.reward_errors[item.env_name] += len(errored)
        if group.failure is None and errored and len(errored) == len(samples):
            group.failure = GroupFailure("reward_error", _reward_error_detail(item.env_name, errored[0]))
        stalled = self._failures.record(item.env_name, group.failure)
        if stalled is not None:
            self._fail(stalled)
        if group.failure is not None:
            done.discard_reason = group.failure.reason
        else:
            self.batches.assign_advantages(done)
            kind = zero_advantage_kind(done.rewards)
            if kind is not None and self.cfg.discard_group_zero_advantage and self.cfg.group_size > 1:
                done.discard_reason, done.zero_advantage_kind = "zero_advantage", kind
                self.counts.zero_advantage[kind] += 1
        if done.discard_reason is not None:
            self._discard(done)
        else:
            self._bucket.append(done)  # reported when it goes into a batch (or is discarded there)
        self._cut_batches()

    def _discard(self, group: RolloutGroup) -> None:
        assert group.discard_reason is not None
        self.counts.discarded[group.discard_reason] += 1
        kind = f"/{group.zero_advantage_kind}" if group.zero_advantage_kind else ""
        self._discards.add(group.discard_reason + kind, group.env_name)
        self.prompts.resolve([group.group_id])
        self._report_group(group)

    def _drop_too_old(self) -> None:
        """Discard bucket groups generated more than ``max_async_rollout`` versions before this batch."""
        limit, step = self.cfg.max_async_rollout, self.counts.inference_step
        fresh = []
        for group in self._bucket:
            if step - group.oldest_version > limit:
                group.discard_reason = "max_async"
                self._discard(group)
            else:
                fresh.append(group)
        self._bucket = fresh

    def _cut_batches(self) -> None:
        size = self.cfg.prompts_batch_size_for_trainer
        while self.counts.inference_step < self.cfg.number_of_steps:
            self._drop_too_old()
            if len(self._bucket) < size:
                return
            groups, self._bucket = self._bucket[:size], self._bucket[size:]
            groups.sort(key=lambda g: g.group_id)  # the batch does not depend on completion order
            batch = self.batches.build(groups, self.trainer.dp_world_size, self.counts.inference_step)
            for group in groups:
                self._report_group(group)
            self._batches.put_nowait(batch)  # batch.step == inference_step
            self.counts.inference_step += 1

    async def _cancel_group(self, gid: int, reason: str | None, requeue: bool = False) -> None:
        """Cancel a running group: ``reason`` counts it as discarded; ``requeue`` serves its prompt again."""
        group = self._groups.pop(gid, None)
        if group is None:
            return
        if requeue:
            self.prompts.requeue([group.prepared.item])
        elif reason is not None:
            self.prompts.resolve([gid])
        self.lanes.drop_group(gid)
        ids = [r.request_id for r in group.running.values()]
        for running in list(group.running.values()):
            running.task.cancel()
        if reason is not None:
            self.counts.discarded[reason] += 1
            self.counts.cancelled_samples += len(ids)
            item = group.prepared.item
            self._discards.add(reason, item.env_name)
            done = [s for s in group.results if s is not None]
            cancelled = RolloutGroup(item.group_id, item.env_name, item.sample_idx, done, self.counts.model_version,
                                     discard_reason=reason)  # fmt: skip
            cancelled.info["cancelled_samples"] = len(ids)
            self._report_group(cancelled)
        if ids:
            try:
                await self.clients[group.server].abort(ids)
            except Exception as exc:  # noqa: BLE001 - the closed connection already aborts it
                log.debug("abort of %s failed: %s", ids, exc)

    async def drain_servers(self, servers: set[int]) -> int:
        """Stop using ``servers``: their queued and running groups are cancelled and re-queued."""
        self.lanes.set_enabled(servers, False)
        gids = [gid for gid, g in self._groups.items() if g.server in servers]
        for gid in gids:
            await self._cancel_group(gid, reason=None, requeue=True)
        return len(gids)

    def restore_servers(self, servers: set[int]) -> None:
        """Use ``servers`` for training rollouts again (never a dropped one)."""
        self.lanes.set_enabled(servers - self._dropped, True)
        self._poke()

    async def _cancel_stale(self) -> None:
        """Cancel groups with a sample still generating that was dispatched too many versions ago."""
        limit = self.cfg.max_off_policy_steps
        if limit < 0:
            return
        stale = [gid for gid, g in self._groups.items()
                 if any(r.generating and self.counts.model_version - r.version > limit for r in g.running.values())]  # fmt: skip
        for gid in stale:
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
                step = batch.step
                await self._train_one(step, batch, time.time() - waited)
        except Exception as exc:  # noqa: BLE001 - re-raised with the stage and step named
            raise stage_error(self._stage, exc, step + 1) from None

    async def _train_one(self, step: int, batch: TrainBatch, waited_s: float) -> None:
        self._wait_for_data_s = waited_s
        self._enter("train_step")
        self._event("trainer", "start", step=step + 1, name="train_step")
        metrics = await self.trainer.train_step(step, batch)
        self._trained_version = step + 1
        self.prompts.resolve([g.group_id for g in batch.groups])
        self._event("trainer", "end", step=step + 1, name="train_step")
        self._enter("weight sync")
        sync = await self.sync_weights(step + 1)
        self.counts.model_version = step + 1
        await self._cancel_stale()
        self.counts.completed_steps = step + 1
        now = time.time()
        timing = {
            "timing_step_total": now - self._step_started,
            "timing_waiting_for_data": self._wait_for_data_s,
        }
        self._step_started = now
        self._discards.reset()
        self._enter("the telescope_step_end hook")
        report = step_metrics(self.counts, batch, metrics, sync, timing)
        rows = self.rollouts.close(step + 1, report)
        self.hook.telescope_step_end(step=step + 1, metrics=report, rollouts=rows)
        self._poke()
        kill = faults.kill_server_after(step + 1)
        if kill is not None and self.healer is not None:
            await self.healer.kill(kill)
        for hook in self.hooks:
            self._enter(f"step hook {type(hook).__name__}")
            await hook.after_step(self, step + 1)

    async def sync_weights(self, version: int) -> dict[str, Any]:
        """Broadcast the trainer's weights as ``version``; held servers receive without applying.

        With a healer, every server is checked first and a dead one restarted (a broadcast to a
        dead member would fail every receiver); restarted servers get work again after it.
        """
        async with self._sync_lock:
            if self.healer is not None:
                for server in range(len(self.clients)):
                    if server in self._healing or server in self._dropped:
                        continue
                    if not await self.healer.healthy(server):
                        self._healing.add(server)
                        await self._restart_server(server)
            sync = await self._broadcast(version)
            self.restore_servers(set(self._healing))
            self._healing.clear()
            return sync

    async def _broadcast(self, version: int) -> dict[str, Any]:
        self._event("weight_sync", "start", step=version)
        self.last_sync_hold = frozenset(self.held_servers)
        sync = dict(await self.trainer.sync_weights(version, self.last_sync_hold))
        self._event("weight_sync", "end", step=version, version=version, digest=str(sync.pop("digest", "")))
        return sync

    # --- self-healing inference (healing.py) ---------------------------------------------------
    async def _server_lost(self, server: int) -> bool:
        """After a failed request: is the server dead? If so, it is being (or will be) restarted."""
        if self.healer is None:
            return False
        if server in self._healing or server in self._dropped:
            return True
        if await self.healer.healthy(server):
            return False
        if server not in self._healing:  # another failed request may have started it meanwhile
            self._healing.add(server)
            self.lanes.set_enabled({server}, False)
            self._spawn(self._heal(server), f"restarting inference server {server}")
        return True

    async def _heal(self, server: int) -> None:
        async with self._sync_lock:
            if server not in self._healing:
                return  # a sync found it dead first and restarted it
            if not await self._restart_server(server):
                return
            if self._trained_version == self.counts.model_version:
                await self._broadcast(self.counts.model_version)  # verified: the server serves this version
                self.restore_servers({server})
                self._healing.discard(server)
            # else: the trainer is ahead; the sync waiting for this lock loads and releases it

    async def _restart_server(self, server: int) -> bool:
        """Drain ``server``, restart its process and re-form the sync group (sync lock held).

        Past ``inference_max_restarts`` the server is dropped while others remain (returns
        False), else the run fails.
        """
        await self.drain_servers({server})
        self._restarts[server] += 1
        tail = await self.healer.log_tail(server)
        limit = self.cfg.inference_max_restarts
        others = [i for i in range(len(self.clients)) if i != server and i not in self._dropped]
        if self._restarts[server] > limit and others:
            log.warning("inference server %d died %d times (inference_max_restarts=%d): dropped, training goes "
                        "on with servers %s; its last log lines:\n%s", server, self._restarts[server], limit,
                        others, tail)  # fmt: skip
            self._dropped.add(server)
            self._healing.discard(server)
            self._event("run", "instant", name="inference_drop", server=server)
            await self.healer.drop(server)
            return False
        if self._restarts[server] > limit:
            log.error("inference server %d died again; its last log lines:\n%s", server, tail)
            last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "(empty)")
            raise ServerRestartsExhaustedError(
                f"inference server {server} died {self._restarts[server]} times (inference_max_restarts={limit}); "
                f"its last log line: {last} (the log is under <run_dir>/logs/inference)"
            )  # fmt: skip
        log.warning("inference server %d died: restarting it (%d of %d), its groups were re-queued; its last log "
                    "lines:\n%s", server, self._restarts[server], limit, tail)  # fmt: skip
        self._event("run", "instant", name="inference_restart", server=server)
        await self.healer.restart(server)
        self.counts.inference_restarts += 1
        return True


def _failed_sample(p: PreparedPrompt, server: int, lane: int, version: int, message: str) -> RolloutSample:
    """The record of a sample whose request failed: nothing generated, nothing scored."""
    return RolloutSample(list(p.prompt_ids), [], [], None, "error", 0.0, 0.0, prompt_text=p.prompt_text,
                         server=server, lane=lane, model_version_start=version, model_version_end=version,
                         info={"error": message})  # fmt: skip


def _reward_error_detail(env: str, sample: RolloutSample) -> str:
    detail = next(iter(sample.info.get("reward_errors") or []), "")
    return f"every reward of the group failed in environment '{env}'" + (f": {detail}" if detail else "")


def describe_state(orch: Orchestrator) -> list[str]:
    """What every server, lane and group is doing (the watchdog's dump)."""
    now = time.time()
    lines = [
        f"stall dump: steps {orch.counts.completed_steps}/{orch.cfg.number_of_steps} done, batches handed to "
        f"the trainer {orch.counts.inference_step}, model version {orch.counts.model_version}, trainer loop in "
        f"'{orch._stage}' for {now - orch._stage_since:.0f}s, {len(orch._bucket)} groups waiting for a batch, "
        f"{orch._batches.qsize()} batches queued for the trainer, discards since the last step: "
        f"{orch._discards.summary() or 'none'}"
    ]  # fmt: skip
    for server in range(orch.lanes.num_servers):
        groups = [g for g in orch._groups.values() if g.server == server]
        running = sum(len(g.running) for g in groups)
        lines.append(f"server {server}: {'enabled' if orch.lanes.enabled(server) else 'disabled'}, "
                     f"{orch.lanes.free_count(server)}/{orch.lanes.slots_per_server} lanes free, {running} samples "
                     f"running, {orch.lanes.queued_count(server)} queued, {len(groups)} groups")  # fmt: skip
    for gid, g in sorted(orch._groups.items()):
        samples = ", ".join(
            f"#{i} lane {r.slot} {'generating' if r.generating else 'scoring'} {now - r.started:.0f}s "
            f"(dispatched at v{r.version}, {r.request_id})"
            for i, r in sorted(g.running.items())
        )  # fmt: skip
        lines.append(f"group {gid} ({g.prepared.item.env_name}) on server {g.server}: {g.finished}/"
                     f"{len(g.results)} finished; running: {samples or 'none'}")  # fmt: skip
    return lines
