"""The inference servers' side of a run: weight syncs, servers held for evals, and healing.

``InferenceSupervisor`` is owned by the ``Orchestrator``. It broadcasts each new version of
the weights (held servers receive and verify a sync without applying it), lends servers out
(``drain``/``restore``), and restarts a server found dead (``healing.py`` says how) or frozen
(``server_watch.py``: ``watch``) while the orchestrator keeps dispatching to the others. A weight
sync and a restart never overlap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from telescope.core.observe.loggers.progress import format_seconds
from telescope.core.runtime.supervision.healing import ServerRestartsExhaustedError
from telescope.core.runtime.supervision.server_watch import AnswerClock, Silence, silent_servers

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.rollouts.lanes import Lanes
    from telescope.core.runtime.step_metrics import Counts
    from telescope.core.runtime.supervision.liveness import RunSnapshot

__all__ = ["InferenceSupervisor", "ServerHealer", "SupervisedRun", "WeightBroadcaster"]

log = logging.getLogger("telescope.orchestrator")


class WeightBroadcaster(Protocol):
    """The trainer side of a weight sync (``RayTrainerGroup`` in production)."""

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, Any]: ...


class ServerHealer(Protocol):
    """Restarts dead servers (``healing.RayServerHealer`` in production)."""

    async def healthy(self, server: int) -> bool: ...
    async def where(self, server: int) -> str: ...
    async def running(self, server: int) -> bool: ...
    async def log_tail(self, server: int) -> str: ...
    async def restart(self, server: int) -> None: ...
    async def drop(self, server: int) -> None: ...
    async def kill(self, server: int) -> None: ...


class SupervisedRun(Protocol):
    """What the supervisor needs from the run it serves (the ``Orchestrator``)."""

    @property
    def trainer(self) -> WeightBroadcaster: ...
    @property
    def counts(self) -> Counts: ...
    def event(self, kind: str, phase: str, **fields: Any) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...
    def poke(self) -> None: ...
    async def requeue_groups(self, servers: set[int]) -> int: ...


class InferenceSupervisor:
    """Keeps the servers on the trainer's weights and replaces the ones that die."""

    def __init__(self, run: SupervisedRun, cfg: TelescopeConfig, lanes: Lanes) -> None:
        self.run = run
        self.max_restarts = cfg.inference_max_restarts
        self.overdue_factor = cfg.inference_overdue_factor
        self.overdue_floor_s = cfg.inference_overdue_floor_s
        self.clock = AnswerClock()
        """When each server last answered a sample (the orchestrator records it): ``watch`` reads it."""
        self.watch_every_s = 5.0
        """How often ``watch`` applies the frozen-server rule (well inside inference_overdue_floor_s, a minute by default)."""
        self.lanes = lanes
        self.num_servers = lanes.num_servers
        self.healer: ServerHealer | None = None
        """Restarts dead inference servers; None: a dead server fails the run."""
        self.held_servers: set[int] = set()
        """Servers kept at older weights (eval servers): later syncs reach them without applying."""
        self.last_sync_hold: frozenset[int] = frozenset()
        """The servers the latest sync did not apply to."""
        self.trained_version = 0
        """The version of the trainer's weights (ahead of the servers' until the sync after a step)."""
        self._sync_lock = asyncio.Lock()  # a weight sync and a server restart never overlap
        self._healing: set[int] = set()
        """Servers found dead: drained, being restarted or waiting for their first sync."""
        self._restarts: Counter[int] = Counter()
        self._dropped: set[int] = set()
        """Servers that died more than ``inference_max_restarts`` times while others remained."""
        self._causes: defaultdict[int, set[str]] = defaultdict(set)
        """Why each server was restarted (``died``, ``stopped answering``), for the lines logged."""
        self._warned: set[int] = set()
        self._snapshot: Callable[[], RunSnapshot] | None = None
        """The orchestrator's ``snapshot`` (given to ``watch``): what a restarted server was doing."""
        """Servers overdue but answering ``/health``: warned about once (until they answer again)."""

    async def drain(self, servers: set[int]) -> int:
        """Stop using ``servers``: their queued and running groups are cancelled and re-queued."""
        self.lanes.set_enabled(servers, False)
        return await self.run.requeue_groups(servers)

    def restore(self, servers: set[int]) -> None:
        """Use ``servers`` for training rollouts again (never a dropped one)."""
        self.lanes.set_enabled(servers - self._dropped, True)
        self.run.poke()

    async def sync_weights(self, version: int) -> dict[str, Any]:
        """Broadcast the trainer's weights as ``version``; held servers receive without applying.

        With a healer, every server is checked first and a dead one restarted (a broadcast to a
        dead member would fail every receiver); restarted servers get work again after it.
        """
        async with self._sync_lock:
            if self.healer is not None:
                for server in range(self.num_servers):
                    if server in self._healing or server in self._dropped:
                        continue
                    if not await self.healer.healthy(server):
                        self._healing.add(server)
                        await self._restart(
                            server,
                            await self._silent_cause(server, f"before the weight sync of version {version}"),
                        )
            sync = await self._broadcast(version)
            self.restore(set(self._healing))
            self._healing.clear()
            return sync

    async def _broadcast(self, version: int, again: bool = True) -> dict[str, Any]:
        """The trainer's sync to every server (sync lock held); a server frozen during it is killed,
        restarted (which re-forms the sync group) and the sync done ``again``, once."""
        self.run.event("weight_sync", "start", step=version)
        self.last_sync_hold = frozenset(self.held_servers)
        frozen: set[int] = set()
        # beside the sync, not around it: awaited directly, the sync yields no more than before
        probe = asyncio.ensure_future(self._frozen_during(version, frozen))
        try:
            sync = dict(await self.run.trainer.sync_weights(version, self.last_sync_hold))
        except Exception:
            probe.cancel()  # the sync done again has its own
            if not frozen or not again:
                raise
            for server in sorted(frozen):
                self._healing.add(server)
                self.lanes.set_enabled({server}, False)
                if not await self._restart(server, "stopped answering"):
                    frozen.discard(server)  # dropped: the group was re-formed without it
            sync = await self._broadcast(version, again=False)
            self.restore(frozen)
            self._healing -= frozen
            return sync
        finally:
            probe.cancel()
        digest = str(sync.pop("digest", ""))
        self.run.event("weight_sync", "end", step=version, version=version, digest=digest)
        return sync

    async def _frozen_during(self, version: int, frozen: set[int]) -> None:
        """Beside a weight sync (cancelled when it ends): past ``inference_overdue_floor_s``, a server
        whose ``/health`` is silent is frozen, its receive would hold the sync for the client's hour.
        Killed (its receive then fails, and so the sync) and added to ``frozen``."""
        if self.healer is None or self.overdue_factor <= 0:
            return
        started = time.monotonic()
        while True:
            await asyncio.sleep(self.watch_every_s)
            if time.monotonic() - started < self.overdue_floor_s:
                continue
            for server in range(self.num_servers):
                if server in self._dropped or server in frozen or await self.healer.healthy(server):
                    continue
                log.error(
                    "inference server %d (%s) is frozen or hung: the weight sync of version %d has waited %s "
                    "(inference_overdue_floor_s %gs) and its /health does not answer: killing it (SIGKILL) and "
                    "restarting it, then syncing again",
                    server,
                    await self.healer.where(server),
                    version,
                    format_seconds(time.monotonic() - started),
                    self.overdue_floor_s,
                )
                self.run.event("run", "instant", name="inference_frozen", server=server)
                frozen.add(server)
                await self.healer.kill(server)

    async def lost(self, server: int) -> bool:
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
            cause = await self._silent_cause(server, "after a failed request")
            self.run.spawn(self._heal(server, cause), f"restarting inference server {server}")
        return True

    async def _silent_cause(self, server: int, when: str) -> str:
        """Why a server whose ``/health`` is silent must be restarted: ``died`` when its process has
        exited, else ``stopped answering`` (it runs but answers nothing: frozen or hung), said in one
        line naming the server, where it runs and what it was doing, since a frozen process is a
        different fault from a crash (a stopped container, a deadlocked engine, a hung driver)."""
        assert self.healer is not None
        if not await self.healer.running(server):
            return "died"
        log.error(
            "inference server %d (%s) is frozen or hung: its /health does not answer %s though its process "
            "runs (%s): killing it (SIGKILL) and restarting it, its groups re-queued",
            server,
            await self.healer.where(server),
            when,
            self._doing(server),
        )
        self.run.event("run", "instant", name="inference_frozen", server=server)
        return "stopped answering"

    async def watch(self, snapshot: Callable[[], RunSnapshot]) -> None:
        """Restart servers that stopped answering (``server_watch.py``); runs as long as the run."""
        if self.healer is None or self.overdue_factor <= 0:
            return
        self._snapshot = snapshot
        while True:
            await asyncio.sleep(self.watch_every_s)
            now = time.time()
            found = silent_servers(snapshot(), self.clock, self.overdue_factor, self.overdue_floor_s, now)
            overdue = {s.server for s in found}
            self._warned &= overdue  # answering again: a later silence is warned about anew
            for silence in found:  # one at a time: each /health asked takes up to 21 s when frozen
                if silence.server not in self._healing | self._dropped | self._warned:
                    await self._check_silent(silence, now)

    async def _check_silent(self, silence: Silence, since: float) -> None:
        """An overdue server: frozen (restarted) when ``/health`` does not answer either."""
        assert self.healer is not None
        server = silence.server
        if await self.healer.healthy(server):
            self._warned.add(server)
            log.warning(
                "inference server %d %s; its /health answers, so it is left running (slow generations? "
                "raise inference_overdue_factor or inference_overdue_floor_s) and stall_timeout_s stays "
                "in charge",
                server,
                silence.describe(),
            )
            return
        if server in self._healing or server in self._dropped:
            return  # a failed request or a sync found it first
        where = await self.healer.where(server)
        log.error(
            "inference server %d (%s) is frozen or hung: it %s; /health unanswered for %s too: killing it "
            "(SIGKILL) and restarting it, its groups re-queued",
            server,
            where,
            silence.describe(),
            f"{time.time() - since:.0f}s",
        )
        self._healing.add(server)
        self.lanes.set_enabled({server}, False)
        self.run.event("run", "instant", name="inference_frozen", server=server)
        self.run.spawn(self._heal(server, "stopped answering"), f"restarting inference server {server}")

    def _doing(self, server: int) -> str:
        """``4 samples generating, the oldest for 12s, its last answer 13s ago`` (now)."""
        now = time.time()
        last = self.clock.last_answer.get(server)
        answer = f"its last answer {format_seconds(now - last)} ago" if last is not None else "no answer yet"
        if self._snapshot is None:
            return answer
        starts = [
            sample.started
            for group in self._snapshot().groups
            if group.server == server
            for sample in group.running
            if sample.generating
        ]
        oldest = f", the oldest for {format_seconds(now - min(starts))}" if starts else ""
        return f"{len(starts)} samples generating{oldest}, {answer}"

    async def _heal(self, server: int, cause: str) -> None:
        async with self._sync_lock:
            if server not in self._healing:
                return  # a sync found it dead first and restarted it
            if not await self._restart(server, cause):
                return
            version = self.run.counts.model_version
            if self.trained_version == version:
                await self._broadcast(version)  # verified: the server serves this version
                self.restore({server})
                self._healing.discard(server)
            # else: the trainer is ahead; the sync waiting for this lock loads and releases it

    async def _restart(self, server: int, cause: str) -> bool:
        """Kill and drain ``server``, restart its process and re-form the sync group (sync lock held).

        ``cause`` says why (``died``, ``stopped answering``) in the lines logged. Past
        ``inference_max_restarts`` the server is dropped while others remain (returns False),
        else the run fails.
        """
        assert self.healer is not None
        doing = self._doing(server)  # before its groups are re-queued
        # SIGKILL first: a frozen process never exits when asked, and its open connections would
        # hold the drain's aborts (and the samples in flight) for the client's hour. A dead one
        # is only reaped.
        await self.healer.kill(server)
        await self.drain({server})
        self._restarts[server] += 1
        tail = await self.healer.log_tail(server)
        limit, died = self.max_restarts, self._restarts[server]
        others = [i for i in range(self.num_servers) if i != server and i not in self._dropped]
        self._causes[server].add(cause)
        failed = " or ".join(sorted(self._causes[server]))  # "died", "died or stopped answering"
        if died > limit and others:
            log.warning(
                "inference server %d %s %d times (inference_max_restarts=%d): dropped, training goes "
                "on with servers %s; its last log lines:\n%s",
                server,
                failed,
                died,
                limit,
                others,
                tail,
            )
            self._dropped.add(server)
            self._healing.discard(server)
            self.run.event("run", "instant", name="inference_drop", server=server)
            await self.healer.drop(server)
            return False
        if died > limit:
            log.error("inference server %d %s again; its last log lines:\n%s", server, cause, tail)
            last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "(empty)")
            raise ServerRestartsExhaustedError(
                f"inference server {server} {failed} {died} times (inference_max_restarts={limit}); "
                f"its last log line: {last} (the log is under <run_dir>/logs/inference)"
            )
        log.warning(
            "inference server %d %s (%s; %s): restarting it (%d of %d), its groups were re-queued; its "
            "last log lines:\n%s",
            server,
            cause,
            await self.healer.where(server),
            doing,
            died,
            limit,
            tail,
        )
        self.run.event("run", "instant", name="inference_restart", server=server)
        await self.healer.restart(server)
        self.run.counts.inference_restarts += 1
        return True
