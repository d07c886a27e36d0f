"""Groups in flight: a prompt's ``group_size`` samples from dispatch until the group is complete.

The orchestrator starts an ``InflightGroup`` on one server, dispatches each of its samples to a
lane (a ``RunningSample`` while it runs) and, once every sample finished or failed, turns it
into the ``RolloutGroup`` the hooks and the batch see (``complete``) — or cancels it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from telescope.core.rollouts.groups import GroupFailure, RolloutGroup, RolloutSample, reward_failed
from telescope.core.rollouts.prompts import PreparedPrompt
from telescope.core.rollouts.rollout import SampleTask, failed_sample, request_seed

__all__ = ["InflightGroup", "RunningSample"]


@dataclass
class RunningSample:
    """One dispatched sample: its task, what it runs, and whether the model is still generating it."""

    task: asyncio.Task[Any]
    sample: SampleTask
    version: int
    """``model_version`` when it was dispatched."""
    started: float = field(default_factory=time.time)
    generating: bool = True


@dataclass
class InflightGroup:
    """A group being generated: its prompt, its server, and its samples' results as they finish."""

    prepared: PreparedPrompt
    server: int
    results: list[RolloutSample | None]
    running: dict[int, RunningSample] = field(default_factory=dict)
    finished: int = 0
    failure: GroupFailure | None = None
    """Why the group cannot be trained on (the first failure of one of its samples)."""
    reward_errors: int = 0
    """Samples whose reward raised or timed out (known once the group is complete)."""
    retries: dict[int, int] = field(default_factory=dict)
    """Sample index -> times it ran again after an infrastructure failure (``rollouts/outcomes.py``)."""
    masked: dict[int, str] = field(default_factory=dict)
    """Sample index -> the infrastructure failure it was masked for (never trained, never scored)."""
    waiting: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    """Sample index -> the task waiting out its backoff before it is queued again."""

    @property
    def group_id(self) -> int:
        return self.prepared.item.group_id

    def sample_task(
        self, index: int, lane: int, model_version: Callable[[], int], run_seed: int
    ) -> SampleTask:
        """What ``lane`` of this group's server needs to run sample ``index`` (dispatched now)."""
        p, gid = self.prepared, self.group_id
        retry = self.retries.get(index, 0)
        return SampleTask(
            f"g{gid}-s{index}-v{model_version()}" + (f"-r{retry}" if retry else ""),
            p.env,
            p.sample,
            p.prompt_ids,
            p.prompt_text,
            p.reward_min,
            p.reward_max,
            self.server,
            lane,
            model_version,
            request_seed(run_seed, gid, index),
            gid,
        )

    def fail(self, index: int, task: SampleTask, version: int, failure: GroupFailure) -> None:
        """Sample ``index`` failed (nothing generated, nothing scored); the group keeps its first failure."""
        self.failure = self.failure or failure
        self.results[index] = failed_sample(task, version, failure.message)

    def mask(self, index: int, message: str) -> None:
        """Sample ``index`` is masked: its infrastructure failures ran out of retries."""
        self.masked[index] = message
        self.results[index] = None

    def is_stale(self, version: int, limit: int) -> bool:
        """A sample still generating was dispatched more than ``limit`` versions before ``version``
        (never with ``limit`` < 0)."""
        return limit >= 0 and any(r.generating and version - r.version > limit for r in self.running.values())

    def cancel(self) -> list[str]:
        """Cancel the running samples' tasks; returns their request ids (to abort on the server)."""
        ids = [r.sample.request_id for r in self.running.values()]
        for running in list(self.running.values()):
            running.task.cancel()
        for waiting in list(self.waiting.values()):
            waiting.cancel()
        return ids

    def complete(self, version: int) -> RolloutGroup:
        """The finished group, ``discard_reason`` set when it failed (a group whose every reward
        failed fails as ``reward_error``, one with fewer than 2 samples left unmasked as
        ``infra_error``); counts ``reward_errors``. Masked samples are not in it."""
        item = self.prepared.item
        samples = [s for s in self.results if s is not None]
        done = RolloutGroup(item.group_id, item.env_name, item.sample_idx, samples, version)
        if self.masked:
            done.info["masked_samples"] = len(self.masked)
        errored = [s for s in samples if reward_failed(s)]
        self.reward_errors = len(errored)
        if self.failure is None and self.masked and len(samples) < 2:
            self.failure = GroupFailure.masked(item.env_name, len(samples), next(iter(self.masked.values())))
        if self.failure is None and errored and len(errored) == len(samples):
            self.failure = GroupFailure.rewards_failed(item.env_name, errored[0])
        if self.failure is not None:
            done.discard_reason = self.failure.reason
        return done

    def cancelled(self, version: int, reason: str, samples_cancelled: int) -> RolloutGroup:
        """The record of a group cancelled for ``reason``, with the samples that had finished."""
        item = self.prepared.item
        done = [s for s in self.results if s is not None]
        group = RolloutGroup(
            item.group_id, item.env_name, item.sample_idx, done, version, discard_reason=reason
        )
        group.info["cancelled_samples"] = samples_cancelled
        return group
