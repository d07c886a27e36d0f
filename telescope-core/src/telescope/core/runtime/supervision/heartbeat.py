"""Trainer heartbeats and the overdue-step rule: a frozen or hung trainer rank is diagnosed, not waited on.

Every trainer rank answers ``heartbeat`` from a thread of its own (the Ray concurrency group
``HEALTH_GROUP``), in the middle of a step too: what it is doing (``PhaseClock``: the method it
runs, for which step, for how long), its pid and node. A frozen rank (SIGSTOP, a machine
swapping to death) answers nothing; a rank stuck in a collective answers that it has been in
``train_step`` for minutes.

``TrainerWatch`` (the driver, for ``RunSession.train``) asks every rank every ``interval_s``:

- a rank whose process died ends the training at once with Ray's error (the driver restarts);
- the step in progress is *overdue* once it has run longer than ``overdue_limit``:
  ``max(trainer_overdue_factor x the median of the recent step durations, trainer_overdue_floor_s)``,
  the durations being the ones ``run.json`` records (``progress.recent_step_seconds``, what the
  dashboard and ``telescope runs show`` compare with). An overdue step while a rank does not
  answer (for ``SILENT_AFTER_S``) or has been in one phase for the limit itself is a hung trainer:
  the run fails with ``TrainerHungError`` naming each such rank and its phase, which the driver
  treats like a dead rank (restart from the latest checkpoint, else one line); ``RunSession.stop``
  SIGKILLs the ranks that did not answer (a stopped process cannot exit when Ray asks it to). An
  overdue step while every rank idles, or is in a phase begun less than the limit ago (the step
  waited elsewhere, e.g. for a restarted inference server), is not the trainer's: one warning per
  step, and the stall watchdog (``stall_timeout_s``) stays in charge.

No step timed yet (the first steps of a fresh run: the first one holds the set-up), the rule
waits: the stall watchdog covers those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.observe.loggers.progress import format_seconds

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.runtime.supervision.liveness import RunSnapshot

__all__ = [
    "HEALTH_GROUP",
    "SILENT_AFTER_S",
    "Beat",
    "PhaseClock",
    "RankView",
    "TrainerHungError",
    "TrainerWatch",
    "diagnose",
    "kill_silent_ranks",
    "overdue_limit",
    "recorded_step_seconds",
]

log = logging.getLogger("telescope.runtime")

HEALTH_GROUP = "health"
"""The Ray concurrency group of ``TrainerWorker.heartbeat``: its own thread, never behind a step."""

SILENT_AFTER_S = 10.0
"""A rank whose heartbeat is unanswered this long is named as not answering (frozen or hung)."""


def overdue_limit(recent: Sequence[float], factor: float, floor_s: float) -> float | None:
    """Seconds after which the step in progress is overdue: ``max(factor x median(recent), floor_s)``.

    None when no step was timed yet or ``factor`` is 0 (the rule is off).
    """
    if factor <= 0 or not recent:
        return None
    return max(factor * statistics.median(recent), floor_s)


# --- the rank's side -----------------------------------------------------------------------------
class PhaseClock:
    """What a trainer rank is doing: set by the thread that trains, read by its heartbeat thread."""

    def __init__(self) -> None:
        self._now: tuple[str, float] = ("", time.monotonic())
        self._last = ""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The rank is in phase ``name`` (``train_step (step 7)``) for the block's duration."""
        self._now = (name, time.monotonic())
        try:
            yield
        finally:
            self._last, self._now = name, ("", time.monotonic())

    def beat(self) -> dict[str, Any]:
        """``{phase, for_s, last}``: the phase (empty: idle), seconds in it, the phase before."""
        phase, since = self._now
        return {"phase": phase, "for_s": time.monotonic() - since, "last": self._last}


# --- the driver's side ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Beat:
    """One rank's answer to a heartbeat, received at ``at`` (the driver's clock)."""

    rank: int
    pid: int
    node_id: str
    phase: str
    """What it runs (``train_step (step 7)``); empty: idle."""
    for_s: float
    """Seconds in ``phase`` (or idle) when it answered (the rank's own clock: no skew between nodes)."""
    last: str
    """The phase it ran before (empty: none yet)."""
    at: float

    @classmethod
    def of(cls, answer: dict[str, Any], at: float) -> Beat:
        return cls(
            int(answer["rank"]),
            int(answer["pid"]),
            str(answer.get("node_id", "")),
            str(answer.get("phase", "")),
            float(answer.get("for_s", 0.0)),
            str(answer.get("last", "")),
            at,
        )

    def doing(self, now: float) -> str:
        """``in train_step (step 7) for 1m02s`` or ``idle for 4s after send_weights (version 6)``."""
        age = format_seconds(self.for_s + max(0.0, now - self.at))
        if self.phase:
            return f"in {self.phase} for {age}"
        return f"idle for {age}" + (f" after {self.last}" if self.last else "")


@dataclass(frozen=True)
class RankView:
    """What the driver knows of one rank now: its latest answer and how long a question waits."""

    rank: int
    beat: Beat | None
    unanswered_s: float
    """Age of the heartbeat still waiting for an answer (0: none waiting)."""

    @property
    def silent(self) -> bool:
        return self.unanswered_s > SILENT_AFTER_S

    def describe(self, now: float) -> str:
        pid = f" (pid {self.beat.pid})" if self.beat is not None else ""
        if not self.silent:
            return f"trainer rank {self.rank}{pid} {self.beat.doing(now) if self.beat else 'not heard yet'}"
        last = f"its last answer: {self.beat.doing(self.beat.at)}" if self.beat else "no answer yet"
        return (
            f"trainer rank {self.rank}{pid} has not answered a heartbeat for "
            f"{format_seconds(self.unanswered_s)} (frozen or hung; {last})"
        )


class TrainerHungError(RuntimeError):
    """The step in progress is overdue and trainer ranks do not answer or are stuck in a phase."""

    complete_reason = True  # ``describe_failure`` shows this message

    def __init__(self, message: str, ranks: list[int], silent: list[Beat]) -> None:
        super().__init__(message)
        self.ranks = ranks
        """The ranks blamed: those that do not answer, else those stuck in a phase."""
        self.silent = silent
        """The last heartbeat of each rank that stopped answering (``kill_silent_ranks``)."""


def diagnose(
    snap: RunSnapshot,
    ranks: list[RankView],
    recent: Sequence[float],
    factor: float,
    floor_s: float,
    now: float,
) -> TrainerHungError | str | None:
    """The overdue rule for the step in progress, at ``now``.

    None: not overdue (or the rule cannot apply yet). A ``TrainerHungError``: overdue while a
    rank does not answer or is busy in a phase. A string: overdue while every rank idles (the
    warning to log; not the trainer's doing).
    """
    limit = overdue_limit(recent, factor, floor_s)
    running_for = now - snap.step_started
    if limit is None or snap.stage == "starting" or snap.completed_steps >= snap.number_of_steps:
        return None
    if running_for <= limit:
        return None
    median = statistics.median(recent)
    step = snap.completed_steps + 1
    head = (
        f"step {step} is overdue: running for {format_seconds(running_for)}, more than "
        f"max({factor:g} x median step {format_seconds(median)}, {floor_s:g}s) "
        f"(trainer_overdue_factor, trainer_overdue_floor_s), the trainer loop in '{snap.stage}'"
    )
    silent = [r for r in ranks if r.silent]
    busy = [r for r in ranks if not r.silent and r.beat is not None and r.beat.phase]
    # Stuck: in its phase for the limit itself. A rank that has just begun its part is not, though the
    # step is overdue: the step waited elsewhere (a restarted vLLM server takes minutes to start).
    stuck = [r for r in busy if r.beat is not None and r.beat.for_s + max(0.0, now - r.beat.at) >= limit]
    if not silent and not busy:
        return f"{head}; every trainer rank is idle: not a trainer hang"
    if not silent and not stuck:
        doing = "; ".join(r.describe(now) for r in busy)
        return f"{head}; {doing}: in its phase for less than that, not a trainer hang"
    blamed = silent or stuck
    named = "; ".join(r.describe(now) for r in [*silent, *busy])
    fix = (
        "If steps this slow are expected, raise trainer_overdue_factor or trainer_overdue_floor_s "
        "(trainer_overdue_factor 0 turns this check off)"
    )
    return TrainerHungError(
        f"{head}; {named}. {fix}",
        [r.rank for r in blamed],
        [r.beat for r in silent if r.beat is not None],
    )


def recorded_step_seconds(run_dir: Path) -> list[float]:
    """``progress.recent_step_seconds`` of ``run_dir/run.json`` (empty when unreadable or absent)."""
    from telescope.core.observe.rundir.reader import read_run_meta

    try:
        progress = read_run_meta(run_dir).get("progress") or {}
    except Exception:  # noqa: BLE001 - no durations: the rule waits (the local logger reports storage errors)
        return []
    values = progress.get("recent_step_seconds") or []
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


class TrainerWatch:
    """Asks every trainer rank for a heartbeat every ``interval_s``; ends the training (``fail``) when a
    rank dies or the overdue rule finds a hung trainer (module docstring)."""

    def __init__(
        self,
        trainers: list[Any],
        cfg: TelescopeConfig,
        snapshot: Callable[[], RunSnapshot | None],
        recent: Callable[[], list[float]],
        fail: Callable[[BaseException], None],
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``snapshot``: the orchestrator's (None before it exists); ``recent``: the recorded step durations."""
        self.trainers = trainers
        self.factor = float(cfg.trainer_overdue_factor)
        self.floor_s = float(cfg.trainer_overdue_floor_s)
        self.stall_timeout_s = float(cfg.stall_timeout_s)
        self.snapshot = snapshot
        self.recent = recent
        self.fail = fail
        self.interval_s = interval_s
        self.clock = clock
        self.beats: dict[int, Beat] = {}
        self._pending: dict[int, tuple[asyncio.Future[Any], float]] = {}
        self._warned_step = 0

    async def run(self) -> None:
        """Until a rank dies or hangs (then ``fail`` was called) or the task is cancelled."""
        try:
            while await self.tick():
                await asyncio.sleep(self.interval_s)
        finally:
            for future, _ in self._pending.values():
                future.cancel()

    async def tick(self) -> bool:
        """Collect answers, ask again, apply the rule; False once the training was failed."""
        import ray

        now = self.clock()
        for rank, (future, _) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[rank]
            try:
                self.beats[rank] = Beat.of(future.result(), now)
            except ray.exceptions.RayActorError as exc:  # the process is gone: Ray's error says how
                self.fail(exc)
                return False
            except Exception as exc:  # noqa: BLE001 - no answer this time; a hang shows as silence
                log.debug("heartbeat of trainer rank %d failed: %s", rank, exc)
        for rank, actor in enumerate(self.trainers):
            if rank not in self._pending:
                ref = actor.heartbeat.options(concurrency_group=HEALTH_GROUP).remote()
                self._pending[rank] = (asyncio.ensure_future(ref), now)
        return self.check(now)

    def views(self, now: float) -> list[RankView]:
        return [
            RankView(
                rank, self.beats.get(rank), now - self._pending[rank][1] if rank in self._pending else 0.0
            )
            for rank in range(len(self.trainers))
        ]

    def check(self, now: float) -> bool:
        """The overdue rule on the current snapshot; False once it failed the training."""
        snap = self.snapshot()
        if snap is None:
            return True
        found = diagnose(snap, self.views(now), self.recent(), self.factor, self.floor_s, now)
        if isinstance(found, TrainerHungError):  # the driver logs it once: restarting, or the run's end
            self.fail(found)
            return False
        step = snap.completed_steps + 1
        if found is not None and self._warned_step != step:
            self._warned_step = step
            stall = f"{self.stall_timeout_s:g}s" if self.stall_timeout_s else "off"
            log.warning("%s (the stall watchdog ends the run at stall_timeout_s: %s)", found, stall)
        return True


def kill_silent_ranks(beats: list[Beat], timeout_s: float = 15.0) -> None:
    """SIGKILL the processes of ranks that stopped answering, each from a task on its own node: a
    stopped process cannot exit when Ray asks, and keeps its memory (and GPU) until Ray's forced kill
    seconds later, maybe after the restarted ranks need it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task: Any = ray.remote(num_cpus=0)(_sigkill)
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(b.node_id, soft=False)).remote(b.pid)
        for b in beats
    ]
    try:
        for beat, killed in zip(beats, ray.get(refs, timeout=timeout_s), strict=True):
            log.warning("trainer rank %d (pid %d): %s", beat.rank, beat.pid, killed)
    except Exception as exc:  # noqa: BLE001 - Ray's own kill of the actors follows
        log.warning("could not SIGKILL the trainer ranks that stopped answering: %s", exc)


def _sigkill(pid: int) -> str:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    return "SIGKILLed (it did not answer heartbeats)"
