"""A run never hangs: every failure ends ``Orchestrator.run`` with the stage named; stalls are diagnosed.

In-process scripted servers and trainers (fakes of the inference client and TrainerHandle); the
same faults on the real runtime are in test_faults_e2e.py. Every run is wrapped in
``asyncio.wait_for``: a regression shows as a TimeoutError instead of a hung suite.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import pytest
from fakes import FakeClient, FakeTrainer, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward

from telescope.core import hookimpl
from telescope.core.errors import RunStageError
from telescope.core.runtime.supervision.liveness import StallError
from telescope.core.runtime.supervision.stall import RolloutsFailingError
from telescope.core.testing import recording_hooks


def run(orch: Any, timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(orch.run(), timeout=timeout))


@dataclass
class RaisingTrainer(FakeTrainer):
    """Raises in ``train_step`` or ``sync_weights`` at a given (1-based) step."""

    train_raises_at: int = 0
    sync_raises_at: int = 0

    async def train_step(self, step: int, batch: Any) -> dict[str, float]:
        if step + 1 == self.train_raises_at:
            await asyncio.sleep(0.05)  # a step takes time: the rollouts it was waiting for are all done
            raise ZeroDivisionError("loss of an empty batch")
        return await super().train_step(step, batch)

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        if version == self.sync_raises_at:
            await asyncio.sleep(0.05)
            raise ConnectionError("server 0 closed the connection")
        return await super().sync_weights(version, hold)


def with_trainer(orch: Any, trainer: FakeTrainer) -> Any:
    orch.trainer = trainer
    return orch


@pytest.mark.parametrize("max_async", [0, 2])
def test_a_trainer_failure_ends_the_run_with_the_step_and_stage(tokenizer: Any, max_async: int) -> None:
    # max_async_rollout 0 used to hang for ever: nothing in flight, nothing woke the main loop
    orch, _, _ = build(
        tokenizer,
        ToyEnv(varied_reward),
        FakeClient(varied_reply(tokenizer)),
        max_async_rollout=max_async,
        number_of_steps=6,
    )
    trainer = with_trainer(orch, RaisingTrainer(train_raises_at=3)).trainer
    with pytest.raises(RunStageError) as info:
        run(orch, timeout=10)
    assert str(info.value).startswith("step 3: train_step failed: ZeroDivisionError: loss of an empty batch")
    assert "logs/telescope.log" in str(info.value) and len(trainer.batches) == 2
    assert orch.counts.completed_steps == 2 and not orch._groups  # in-flight groups were cancelled


def test_a_weight_sync_failure_names_the_sync_and_the_likely_cause(tokenizer: Any) -> None:
    orch, _, _ = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), max_async_rollout=0
    )
    with_trainer(orch, RaisingTrainer(sync_raises_at=2))
    with pytest.raises(
        RunStageError, match=r"^step 2: weight sync failed: ConnectionError: server 0 closed.*died"
    ):
        run(orch)


class BrokenStepPlugin:
    @hookimpl
    def telescope_step_end(self, step: int) -> None:
        raise KeyError("reward/mean")


class BrokenGroupPlugin:
    @hookimpl
    def telescope_group_end(self, group: Any) -> None:
        raise ValueError("cannot record")


def test_a_failing_step_end_plugin_ends_the_run(tokenizer: Any) -> None:
    orch, _, _ = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), max_async_rollout=0
    )
    orch.hook, _ = recording_hooks(BrokenStepPlugin())
    with pytest.raises(
        RunStageError, match=r"^step 1: the telescope_step_end hook failed: KeyError: 'reward/mean'"
    ):
        run(orch)


def test_a_failing_group_end_plugin_ends_the_run_from_a_rollout_task(tokenizer: Any) -> None:
    def reward(completion: str, sample: Any) -> float:
        return 1.0  # every group zero-advantage: reported (and failing) when it completes

    orch, _, _ = build(tokenizer, ToyEnv(reward), FakeClient(varied_reply(tokenizer)))
    orch.hook, _ = recording_hooks(BrokenGroupPlugin())
    with pytest.raises(RunStageError, match=r"the rollout task of group \d+ sample \d failed: ValueError"):
        run(orch)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prompt_that_fails_to_prepare_ends_the_run(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, prefetch: bool
) -> None:
    # The 40th prompt: long after the prefetch buffer (4) was first filled. The fill task's
    # failure used to be checked only before waiting on an empty buffer: the run hung.
    monkeypatch.setenv("TELESCOPE_FAULTS", "prompt_raise@40")
    orch, trainer, _ = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), number_of_steps=50
    )
    orch.prompts.prefetch = 4 if prefetch else 0
    prepare = orch.prompts._prepare

    def slow_prepare(item: Any) -> Any:  # a slow dataset: the orchestrator waits on an empty buffer
        time.sleep(0.05)
        return prepare(item)

    orch.prompts._prepare = slow_prepare
    with pytest.raises(RunStageError) as info:
        run(orch, timeout=10)
    message = str(info.value)
    assert message.startswith("prompt preparation (environment 'toy', sample ")
    assert (
        "InjectedFault: TELESCOPE_FAULTS: prompt_raise@40" in message and "enable_prompt_prefetch" in message
    )
    assert 0 < len(trainer.batches) < 50


def test_no_step_for_stall_timeout_dumps_every_server_lane_and_group(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = FakeClient(varied_reply(tokenizer), delay=lambda rid: 3600.0)  # a server that never answers
    orch, _, _ = build(tokenizer, ToyEnv(varied_reward), client, stall_timeout_s=0.5)
    with caplog.at_level(logging.ERROR, logger="telescope.orchestrator"), pytest.raises(StallError) as info:
        run(orch)
    assert "no training step completed for" in str(info.value) and "stall_timeout_s=0.5" in str(info.value)
    assert "waiting for step 1, the trainer loop in 'waiting for a batch'" in str(info.value)
    dump = [r.getMessage() for r in caplog.records]
    assert dump[0].startswith("stall dump: steps 0/3 done")
    # 2 prompts per batch, group_size 4, 2 prompts per server: 8 lanes, all generating
    assert "server 0: enabled, 0/8 lanes free, 8 samples running, 0 queued, 2 groups" in dump
    groups = [line for line in dump if line.startswith("group ")]
    assert len(groups) == 2 and all("0/4 finished" in g and g.count("generating") == 4 for g in groups)
    assert sorted(client.aborted) == sorted(f"g{g}-s{i}-v0" for g in (0, 1) for i in range(4))


def test_a_run_that_discards_everything_says_so_every_few_seconds(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def reward(completion: str, sample: Any) -> float:
        return 0.0  # every group all_zero: nothing ever trains

    orch, _, _ = build(tokenizer, ToyEnv(reward), FakeClient(varied_reply(tokenizer)), stall_timeout_s=1.5)
    orch.progress_every_s = 0.3
    with caplog.at_level(logging.WARNING, logger="telescope.orchestrator"), pytest.raises(StallError):
        run(orch)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no batch for step 1")]
    assert 2 <= len(lines) <= 6, lines  # rate-limited: one line per interval, not one per group
    assert "(0 of 2 groups collected)" in lines[-1]
    counted = [int(m.group(1)) for m in map(COUNTS.search, lines) if m and m.group(1) == m.group(2)]
    assert len(counted) == len(lines) and counted == sorted(counted)  # growing: nothing was trained
    assert 0 < counted[-1] <= orch.counts.discarded["zero_advantage"]


COUNTS = re.compile(r"discarded since the last step: zero_advantage/all_zero (\d+) \(toy (\d+)\)$")


def test_a_reward_that_always_raises_stops_the_run_naming_its_environment(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(completion: str, sample: Any) -> float:
        raise ZeroDivisionError("division by zero in the reward")

    orch, trainer, observer = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), number_of_steps=500
    )
    bad = ToyEnv(broken)
    bad.name = "bad"
    bad.samples()
    two_envs(orch, bad, weight_bad=3.0)
    with caplog.at_level(logging.INFO, logger="telescope"), pytest.raises(RolloutsFailingError) as info:
        run(orch, timeout=60)
    message = str(info.value)
    assert (
        "none of the last 200 prompt groups of environment 'bad' produced a usable rollout (reward_error 200)"
        in message
    )
    assert (
        "every reward of the group failed in environment 'bad'" in message and "ZeroDivisionError" in message
    )
    assert len(trainer.batches) > 0  # the healthy environment trained meanwhile
    assert all(g.env_name == "toy" for b in trainer.batches for g in b.groups)
    first = [r for r in caplog.records if "reward function 'compute_reward' failed" in r.getMessage()]
    assert len(first) == 1 and first[0].exc_info is not None and "environment 'bad'" in first[0].getMessage()
    assert orch.counts.reward_errors["bad"] >= 200 * 4 and orch.counts.reward_errors["toy"] == 0
    assert orch.counts.discarded["reward_error"] >= 200


def two_envs(orch: Any, bad: ToyEnv, weight_bad: float) -> None:
    """Add environment ``bad`` to a built orchestrator's prompt source."""
    from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv

    prompts = orch.prompts
    toy = prompts.envs["toy"]
    sources = [SourceEnv("toy", 1.0, len(toy)), SourceEnv("bad", weight_bad, len(bad))]
    prompts.scheduler = PromptScheduler(sources, orch.cfg.seed)
    prompts.envs["bad"] = bad
    prompts.ranges["bad"] = (None, None)


def test_injected_request_failures_are_counted_and_survived(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELESCOPE_FAULTS", "request_fail=0.1")
    orch, trainer, observer = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), number_of_steps=8
    )
    counts = run(orch)
    assert counts.completed_steps == 8
    failed = [g for _, g in observer.groups if g.discard_reason == "rollout_error"]
    errored = [s for g in failed for s in g.samples if s.finish_reason == "error"]
    assert failed and counts.discarded["rollout_error"] == len(failed)
    assert counts.rollout_errors == len(errored) and all("request_fail" in s.info["error"] for s in errored)
    assert all(s.finish_reason != "error" for b in trainer.batches for g in b.groups for s in g.samples)
    total = sum(len(g.samples) for _, g in observer.groups)
    assert 0.02 < counts.rollout_errors / total < 0.25  # ~10% of the requests
