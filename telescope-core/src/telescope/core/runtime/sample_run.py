"""One dispatched sample, from its lane to its outcome (``rollouts/outcomes.py``).

The sample generates and is scored (``RolloutRunner.run``), and ends as one of:

- ``model``: scored (whatever the model's output did: a crash of its code or a wrong answer too);
- ``infra``: an infrastructure failure (``telescope.core.infra.InfraError``) ended the attempt: the
  sample runs again after a backoff on its group's server, or, out of retries, is masked;
- cancelled: its group was cancelled (stale, drained, the run ending): the task is cancelled.

A request that failed for another reason still fails its group (``rollout_error``), unless its
server was lost: then the group is served again once the server is drained (``servers.lost``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from telescope.core import infra
from telescope.core.observe.rundir.records import TimelineEvent
from telescope.core.rollouts.groups import GroupFailure
from telescope.core.rollouts.lanes import QueuedSample
from telescope.core.rollouts.rollout import PromptTooLongError
from telescope.core.weights.errors import StaleWeightsError

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.rollouts.inflight import InflightGroup
    from telescope.core.rollouts.lanes import Lanes
    from telescope.core.rollouts.outcomes import InfraLedger
    from telescope.core.rollouts.rollout import RolloutRunner, SampleTask
    from telescope.core.runtime.step_metrics import Counts
    from telescope.core.runtime.supervision.servers import InferenceSupervisor

__all__ = ["SampleHost", "run_sample"]

log = logging.getLogger("telescope.orchestrator")


class SampleHost(Protocol):
    """What a sample needs of its run (the ``Orchestrator``)."""

    cfg: TelescopeConfig
    counts: Counts
    individual: bool
    lanes: Lanes
    servers: InferenceSupervisor
    runner: RolloutRunner
    clients: list[ServerClient]
    infra: InfraLedger

    def emit(self, event: TimelineEvent) -> None: ...
    def poke(self) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...
    def fail(self, error: BaseException) -> None: ...
    def complete_group(self, group: InflightGroup) -> None: ...
    def is_inflight(self, group: InflightGroup) -> bool: ...


async def run_sample(run: SampleHost, group: InflightGroup, index: int, task: SampleTask) -> None:
    """Run sample ``index`` of ``group`` once; count its outcome; complete the group when it is the last."""
    freed = generated = False
    gid, server, lane = group.prepared.item.group_id, task.server, task.lane
    env, version = group.prepared.item.env_name, run.counts.model_version
    infra.attributed_to(env)  # failures counted where they happen, in this task: under its environment

    def event(kind: str, phase: str, on_server: bool = True) -> None:  # built directly: 4 per sample
        at = (server, lane) if on_server else (None, None)
        step = run.counts.inference_step + 1
        run.emit(
            TimelineEvent(kind, phase, step=step, group_id=gid, sample_id=index, server=at[0], lane=at[1])
        )

    def on_generated() -> None:  # generation over (all turns), the reward comes next
        nonlocal freed, generated
        generated = True
        running = group.running.get(index)
        if running is not None:
            running.generating = False  # scoring does not age a sample (max_off_policy_steps)
            run.servers.clock.answered(server, running.started)  # the frozen-server rule's data
        event("generation", "end")
        event("reward", "start", on_server=False)
        if not freed and run.cfg.free_lane_after_generation and run.individual:
            freed = True
            run.lanes.release(server, lane)
            run.poke()

    event("generation", "start")
    retry_in: float | None = None
    try:
        group.results[index] = await run.runner.run(run.clients[server], task, on_generated)
        run.infra.attempt_finished()
    except (asyncio.CancelledError, StaleWeightsError):  # stale: never train on it, the run ends
        raise
    except PromptTooLongError as exc:
        run.infra.attempt_finished()
        group.fail(index, task, version, GroupFailure("prompt_too_long", str(exc)))
    except Exception as exc:  # noqa: BLE001 - an infrastructure failure is retried or masked, another discards its group
        if await run.servers.lost(server):
            return  # not the sample's fault: its group is re-queued when the server is drained
        retry_in = _failed(run, group, index, task, version, exc)
    finally:
        if not freed:
            run.lanes.release(server, lane)
        group.running.pop(index, None)
        if generated:
            event("reward", "end", on_server=False)
        else:  # failed or cancelled while generating
            event("generation", "end")
    if retry_in is not None:
        group.waiting[index] = run.spawn(
            _retry_later(run, group, index, retry_in), f"the retry of {task.request_id}"
        )
        return
    group.finished += 1
    if group.finished == run.cfg.group_size:
        run.complete_group(group)
    run.poke()


def _failed(
    run: SampleHost, group: InflightGroup, index: int, task: SampleTask, version: int, exc: Exception
) -> float | None:
    """Account for a failed attempt; returns the seconds before it runs again, None when it does not."""
    error = infra.infra_cause(exc)
    if error is None:
        run.infra.attempt_finished()
        run.counts.rollout_errors += 1
        message = f"{type(exc).__name__}: {exc}"
        group.fail(index, task, version, GroupFailure("rollout_error", message))
        log.warning("rollout of group %d sample %d failed: %s", group.group_id, index, message)
        return None
    if not group.retries and not group.masked:
        run.infra.group_hit()
    retries = group.retries.get(index, 0)
    what = f"{task.request_id}: infrastructure failure ({error.cause}, provider '{error.provider}'): {error}"
    if run.infra.failed(group.prepared.item.env_name, error, retries):
        group.retries[index] = retries + 1
        delay = run.infra.policy.backoff(retries + 1)
        log.info("%s; retry %d in %.1fs", what, retries + 1, delay)
    else:
        delay = None
        group.mask(index, f"{error.cause} ({error.provider}): {error}")
        log.warning("%s; masked after %d retries (its group trains on its other samples)", what, retries)
    stop = run.infra.rate_exceeded()
    if stop is not None:
        run.fail(stop)
    return delay


async def _retry_later(run: SampleHost, group: InflightGroup, index: int, delay: float) -> None:
    """Queue sample ``index`` again on its group's server after ``delay`` (unless the group is gone)."""
    try:
        await asyncio.sleep(delay)
    finally:
        group.waiting.pop(index, None)
    if run.is_inflight(group):
        run.lanes.enqueue(group.server, QueuedSample(group.group_id, index))
        run.poke()
