"""Orchestrator state across a resume: no prompt lost or repeated, same batches when synchronous."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import FakeClient, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward

from telescope.core.errors import RunStageError
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv
from telescope.core.testing import RunRecorder


class Crash(Exception):
    """Stands in for the process dying."""


class SnapshotThenCrash:
    """A step hook: take the checkpoint state at ``save_at``, die after ``crash_at``."""

    def __init__(self, save_at: int, crash_at: int) -> None:
        self.save_at, self.crash_at = save_at, crash_at
        self.state: dict[str, Any] | None = None

    async def after_step(self, orchestrator: Any, step: int) -> None:
        if step == self.save_at:
            self.state = orchestrator.state_dict()
        if step == self.crash_at:
            raise Crash(f"killed after step {step}")


def trained_ids(trainer: Any) -> list[list[int]]:
    return [[g.group_id for g in b.groups] for b in trainer.batches]


def discarded_ids(recorder: RunRecorder) -> set[int]:
    """Groups the run dropped with a record (e.g. too stale for ``max_async_rollout`` under load)."""
    return {g.group_id for _, g in recorder.groups if g.discard_reason is not None}


def run_with_crash(
    tokenizer: Any, save_at: int, crash_at: int, **overrides: Any
) -> tuple[Any, Any, Any, RunRecorder]:
    client = FakeClient(varied_reply(tokenizer), delay=lambda rid: 0.002 * (hash(rid) % 5))
    orch, trainer, recorder = build(tokenizer, ToyEnv(varied_reward), client, **overrides)
    hook = SnapshotThenCrash(save_at, crash_at)
    orch.hooks.append(hook)
    with pytest.raises(
        RunStageError, match=f"step {crash_at}: step hook SnapshotThenCrash failed: Crash: killed"
    ):
        asyncio.run(orch.run())
    return orch, trainer, hook.state, recorder


def resume(tokenizer: Any, state: dict[str, Any], **overrides: Any) -> tuple[Any, Any, RunRecorder]:
    client = FakeClient(varied_reply(tokenizer), delay=lambda rid: 0.002 * (hash(rid) % 5))
    orch, trainer, recorder = build(tokenizer, ToyEnv(varied_reward), client, **overrides)
    orch.load_state_dict(state)
    asyncio.run(orch.run())
    return orch, trainer, recorder


@pytest.mark.parametrize("max_async", [1, 3])
def test_async_resume_loses_and_repeats_no_prompt(tokenizer: Any, max_async: int) -> None:
    fields = {"number_of_steps": 6, "max_async_rollout": max_async, "discard_group_zero_advantage": False}
    _, first, state, first_seen = run_with_crash(tokenizer, save_at=3, crash_at=5, **fields)
    assert state is not None and state["counts"]["completed_steps"] == 3
    assert state["prompts"]["outstanding"], "async generation ran ahead: some prompts were in flight"
    orch, second, second_seen = resume(tokenizer, state, **fields)
    history = trained_ids(first)[:3] + trained_ids(second)
    assert len(history) == 6
    trained = [gid for batch in history for gid in batch]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    left = [i.group_id for i in orch.prompts.outstanding()]
    dropped = (discarded_ids(first_seen) | discarded_ids(second_seen)) - set(trained) - set(left)
    used = sorted(trained + left + sorted(dropped))
    assert used == list(range(len(used))), "a drawn prompt was neither trained, discarded nor left pending"
    # Group ids name the same prompts as an independent replay of the scheduler.
    replay = PromptScheduler([SourceEnv("toy", 1.0, 20)], orch.cfg.seed)
    expected = {i.group_id: i.sample_idx for i in (replay.next() for _ in range(len(used)))}
    seen = {g.group_id: g.sample_idx for b in [*first.batches[:3], *second.batches] for g in b.groups}
    assert seen == {gid: expected[gid] for gid in seen}


def test_synchronous_resume_trains_the_same_batches(tokenizer: Any) -> None:
    fields = {"number_of_steps": 6, "max_async_rollout": 0, "discard_group_zero_advantage": False}
    _, first, state, _ = run_with_crash(tokenizer, save_at=3, crash_at=5, **fields)
    _, second, _ = resume(tokenizer, state, **fields)
    assert trained_ids(second)[:2] == trained_ids(first)[3:5]
    assert second.versions == [4, 5, 6]


def test_counters_continue_across_a_resume(tokenizer: Any) -> None:
    def reward(completion: str, sample: Any) -> float:
        return 1.0 if sample.metadata["i"] % 3 == 0 else float(len(completion))

    fields = {"number_of_steps": 4, "max_async_rollout": 0}
    client = FakeClient(varied_reply(tokenizer))
    orch, _, _ = build(tokenizer, ToyEnv(reward), client, **fields)
    hook = SnapshotThenCrash(save_at=2, crash_at=3)
    orch.hooks.append(hook)
    with pytest.raises(RunStageError, match="Crash: killed after step 3"):
        asyncio.run(orch.run())
    assert hook.state is not None
    saved = hook.state["counts"]["zero_advantage"].get("all_positive", 0)
    again, _, _ = build(tokenizer, ToyEnv(reward), FakeClient(varied_reply(tokenizer)), **fields)
    again.load_state_dict(hook.state)
    assert again.counts.zero_advantage["all_positive"] == saved
    counts = asyncio.run(again.run())
    assert counts.completed_steps == 4 and counts.zero_advantage["all_positive"] >= saved
