"""A run never hangs: failures of its parts end it with what, where and the fix; stalls are diagnosed.

- ``stage_error`` (``telescope.core.errors``): any exception in the trainer loop, the prompt
  prefetch or a rollout task becomes one ``RunStageError`` naming the stage and the step.
- ``StallError``: no training step completed for ``stall_timeout_s``; raised after the
  orchestrator logged what every server, lane and group was doing.
- ``DiscardTally``: the groups discarded since the last step, by reason and environment, for
  the line printed every few seconds while no batch fills.
- ``watchdog``: reads the orchestrator's ``RunSnapshot`` a few times a second; prints that line,
  and past ``stall_timeout_s`` logs ``describe_state`` (every server, lane and group) and fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.rollouts.inflight import InflightGroup
    from telescope.core.rollouts.lanes import Lanes

__all__ = [
    "DiscardTally",
    "GroupState",
    "RunSnapshot",
    "SampleState",
    "ServerState",
    "StallError",
    "describe_state",
    "watchdog",
]

log = logging.getLogger("telescope.orchestrator")


class StallError(RuntimeError):
    """No training step completed within ``stall_timeout_s``."""


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


@dataclass(frozen=True)
class SampleState:
    """One running sample of a group."""

    index: int
    lane: int
    generating: bool
    """False once the model is done with it (its reward is being computed)."""
    started: float
    version: int
    """``model_version`` when it was dispatched."""
    request_id: str


@dataclass(frozen=True)
class GroupState:
    """One group in flight: how many of its samples finished, and the running ones."""

    group_id: int
    env_name: str
    server: int
    finished: int
    size: int
    running: list[SampleState]

    @classmethod
    def of(cls, group: InflightGroup) -> GroupState:
        running = [
            SampleState(i, r.sample.lane, r.generating, r.started, r.version, r.sample.request_id)
            for i, r in sorted(group.running.items())
        ]
        env = group.prepared.item.env_name
        return cls(group.group_id, env, group.server, group.finished, len(group.results), running)


@dataclass(frozen=True)
class ServerState:
    """The lanes of one inference server."""

    enabled: bool
    free_lanes: int
    lanes: int
    queued: int

    @classmethod
    def of(cls, lanes: Lanes, server: int) -> ServerState:
        return cls(
            lanes.enabled(server),
            lanes.free_count(server),
            lanes.slots_per_server,
            lanes.queued_count(server),
        )


@dataclass(frozen=True)
class RunSnapshot:
    """What the orchestrator is doing at one moment (``Orchestrator.snapshot()``)."""

    completed_steps: int
    number_of_steps: int
    inference_step: int
    """Batches handed to the trainer so far."""
    model_version: int
    stage: str
    """What the trainer loop is doing."""
    stage_since: float
    step_started: float
    """When the step in progress started (the previous one ended)."""
    groups_waiting: int
    """Finished groups waiting for a batch."""
    groups_per_batch: int
    batches_queued: int
    """Batches cut and waiting for the trainer."""
    discards: str
    """The groups discarded since the last step (``DiscardTally.summary``); empty: none."""
    servers: list[ServerState]
    groups: list[GroupState]


def describe_state(snap: RunSnapshot, now: float) -> list[str]:
    """What every server, lane and group is doing (the watchdog's dump)."""
    lines = [
        f"stall dump: steps {snap.completed_steps}/{snap.number_of_steps} done, batches handed to "
        f"the trainer {snap.inference_step}, model version {snap.model_version}, trainer loop in "
        f"'{snap.stage}' for {now - snap.stage_since:.0f}s, {snap.groups_waiting} groups waiting for a batch, "
        f"{snap.batches_queued} batches queued for the trainer, discards since the last step: "
        f"{snap.discards or 'none'}"
    ]
    for server, state in enumerate(snap.servers):
        groups = [g for g in snap.groups if g.server == server]
        running = sum(len(g.running) for g in groups)
        lines.append(
            f"server {server}: {'enabled' if state.enabled else 'disabled'}, "
            f"{state.free_lanes}/{state.lanes} lanes free, {running} samples "
            f"running, {state.queued} queued, {len(groups)} groups"
        )
    for g in snap.groups:
        samples = ", ".join(
            f"#{r.index} lane {r.lane} {'generating' if r.generating else 'scoring'} {now - r.started:.0f}s "
            f"(dispatched at v{r.version}, {r.request_id})"
            for r in g.running
        )
        lines.append(
            f"group {g.group_id} ({g.env_name}) on server {g.server}: {g.finished}/"
            f"{g.size} finished; running: {samples or 'none'}"
        )
    return lines


async def watchdog(
    snapshot: Callable[[], RunSnapshot],
    fail: Callable[[BaseException], None],
    stall_timeout_s: float,
    progress_every_s: float,
) -> None:
    """Fails a run with no step for ``stall_timeout_s``; says why no batch fills meanwhile."""
    stall = float(stall_timeout_s)
    tick = min(progress_every_s, stall) if stall > 0 else progress_every_s
    last_line = time.time()
    while True:
        await asyncio.sleep(max(0.05, tick / 4))
        now, snap = time.time(), snapshot()
        idle = now - snap.step_started
        if stall > 0 and idle > stall:
            for line in describe_state(snap, now):
                log.error("%s", line)
            fail(
                StallError(
                    f"no training step completed for {idle:.0f}s (stall_timeout_s={stall:g}) while "
                    f"waiting for step {snap.completed_steps + 1}, the trainer loop in '{snap.stage}': "
                    "what every server, lane and group was doing is in <run_dir>/logs/telescope.log; "
                    "raise stall_timeout_s for steps this slow, 0 turns the watchdog off"
                )
            )
            return
        if snap.discards and idle >= progress_every_s and now - last_line >= progress_every_s:
            last_line = now
            log.warning(
                "no batch for step %d yet after %.0fs (%d of %d groups collected); discarded since the "
                "last step: %s",
                snap.inference_step + 1,
                idle,
                snap.groups_waiting,
                snap.groups_per_batch,
                snap.discards,
            )
