"""Orchestrator semantics with an in-process scripted server and trainer (no Ray, no model)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fakes import FakeClient, FakeTrainer, ToyEnv

from telescope.core.algorithms import get_algorithm
from telescope.core.env.chat import ChatOptions
from telescope.core.rollouts.batching import BatchBuilder
from telescope.core.rollouts.prompts import PromptSource
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv
from telescope.core.rollouts.tokens import stop_token_ids
from telescope.core.runtime.orchestrator import Orchestrator
from telescope.core.runtime.supervision.faults import install_faults
from telescope.core.testing import RunRecorder, make_config, recording_hooks


def build(
    tokenizer: Any,
    env: ToyEnv,
    client: FakeClient | list[FakeClient],
    plugins: tuple[object, ...] = (),
    **overrides: Any,
) -> tuple[Orchestrator, FakeTrainer, RunRecorder]:
    fields = {
        "environments": [{"name": "toy"}],
        "group_size": 4,
        "prompts_batch_size_for_trainer": 2,
        "number_of_steps": 3,
        "max_async_rollout": 0,
        "max_tokens": 8,
        "seq_len": 256,
        "pad_to_multiple_of": 8,
        "max_concurrent_prompts_per_server": 2,
        "prompt_prefetch_buffer_size": 4,
        **overrides,
    }
    cfg = make_config(**fields)
    env.samples()
    prompts = PromptSource(
        PromptScheduler([SourceEnv("toy", 1.0, len(env))], cfg.seed),
        {"toy": env},
        {"toy": (None, None)},
        tokenizer,
        ChatOptions(),
        cfg.prompt_prefetch_buffer_size,
    )
    runner = RolloutRunner(tokenizer, GenerationSettings.from_config(cfg, stop_token_ids(tokenizer)), None)
    trainer, (hook, recorder) = FakeTrainer(), recording_hooks(*plugins)
    batches = BatchBuilder(cfg, get_algorithm(cfg.algorithm), 0)
    clients = client if isinstance(client, list) else [client]
    orch = Orchestrator(cfg, prompts, runner, clients, trainer, batches, hook)
    install_faults(orch)  # as the run's assembly does: a no-op unless TELESCOPE_FAULTS is set
    return orch, trainer, recorder


def varied_reply(tokenizer: Any) -> Any:
    counter = iter(range(10**6))
    return lambda prompt, rid: tokenizer.encode("ab" * (next(counter) % 3 + 1), add_special_tokens=False)


def varied_reward(completion: str, sample: Any) -> float:
    return float(len(completion))


def test_a_plugin_failing_on_an_event_inside_a_request_ends_the_run_naming_the_hook(tokenizer: Any) -> None:
    from telescope.core import hookimpl
    from telescope.core.errors import RunStageError

    class FailsOnGenerationEnd:
        @hookimpl
        def telescope_events(self, events: list[Any]) -> None:
            if any(e.type == "generation" and e.phase == "end" for e in events):
                raise RuntimeError("plugin bug")

    client = FakeClient(varied_reply(tokenizer))
    orch, trainer, _ = build(tokenizer, ToyEnv(varied_reward), client, plugins=(FailsOnGenerationEnd(),))
    with pytest.raises(RunStageError, match="the telescope_events hook failed: RuntimeError: plugin bug"):
        asyncio.run(orch.run())
    assert orch.counts.rollout_errors == 0 and not trainer.batches  # not taken for failed requests


def test_timeline_events_reach_the_hooks_a_loop_turn_at_a_time_in_order(tokenizer: Any) -> None:
    from telescope.core import hookimpl

    class Calls:
        def __init__(self) -> None:
            self.calls: list[list[Any]] = []

        @hookimpl
        def telescope_events(self, events: list[Any]) -> None:
            self.calls.append(list(events))

    plugin = Calls()
    orch, trainer, _ = build(
        tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)), plugins=(plugin,)
    )
    asyncio.run(orch.run())
    events = [e for call in plugin.calls for e in call]
    assert len(plugin.calls) < len(events)  # handed over together, not one call per event
    assert [e.time for e in events] == sorted(e.time for e in events)  # in the order they happened
    spans: dict[tuple[int, int], list[str]] = {}
    for e in events:
        if e.type in ("generation", "reward"):
            spans.setdefault((e.group_id, e.sample_id), []).append(f"{e.type} {e.phase}")
    trained = sum(len(g.samples) for batch in trainer.batches for g in batch.groups)
    assert len(spans) >= trained > 0
    assert all(
        s == ["generation start", "generation end", "reward start", "reward end"] for s in spans.values()
    )
    trainer_steps = [e.step for e in events if e.type == "trainer" and e.phase == "end"]
    assert trainer_steps == [1, 2, 3]  # every step's trainer span reached the hooks


def test_a_plugin_failing_on_the_runs_last_events_fails_the_run(tokenizer: Any) -> None:
    from telescope.core import hookimpl
    from telescope.core.errors import RunStageError

    class FailsAtTheEnd:
        closing = False

        @hookimpl
        def telescope_events(self, events: list[Any]) -> None:
            if self.closing:
                raise RuntimeError("plugin bug at the end")

    plugin = FailsAtTheEnd()
    client = FakeClient(varied_reply(tokenizer))
    orch, _, _ = build(tokenizer, ToyEnv(varied_reward), client, plugins=(plugin,))
    shutdown = orch._shutdown

    async def shutdown_then_an_event(trainer_task: Any) -> None:  # the run's last event comes after it
        await shutdown(trainer_task)
        plugin.closing = True
        orch.event("run", "instant", name="last")

    orch._shutdown = shutdown_then_an_event  # type: ignore[method-assign]
    with pytest.raises(
        RunStageError, match="the telescope_events hook failed: RuntimeError: plugin bug at the end"
    ):
        asyncio.run(orch.run())


def test_synchronous_batches_come_from_the_latest_weights(tokenizer: Any) -> None:
    client = FakeClient(varied_reply(tokenizer))
    orch, trainer, observer = build(tokenizer, ToyEnv(varied_reward), client)
    counts = asyncio.run(orch.run())
    assert counts.completed_steps == 3 and trainer.versions == [1, 2, 3]
    for step, batch in enumerate(trainer.batches):
        assert len(batch.groups) == 2
        versions = {s.model_version_start for g in batch.groups for s in g.samples}
        assert versions == {step}, f"batch {step} generated by versions {versions}"
    assert len(observer.steps) == 3 and all("timing_step_total" in m for m in observer.steps)
    # Every sample carries its advantage; each group is z-scored (GRPO): sums to ~0.
    for batch in trainer.batches:
        for g in batch.groups:
            assert abs(sum(s.advantage for s in g.samples)) < 1e-6


def test_async_overlap_allows_batches_ahead(tokenizer: Any) -> None:
    client = FakeClient(varied_reply(tokenizer))
    orch, trainer, _ = build(tokenizer, ToyEnv(varied_reward), client, max_async_rollout=2, number_of_steps=4)
    asyncio.run(orch.run())
    lags = [
        step - min(s.model_version_start for g in b.groups for s in g.samples)
        for step, b in enumerate(trainer.batches)
    ]
    assert max(lags) <= 2 and all(lag >= 0 for lag in lags)


def test_zero_advantage_groups_are_dropped_and_counted(tokenizer: Any) -> None:
    def reward(completion: str, sample: Any) -> float:
        return 1.0 if sample.metadata["i"] % 2 == 0 else float(len(completion))  # even prompts: all equal

    orch, trainer, observer = build(tokenizer, ToyEnv(reward), FakeClient(varied_reply(tokenizer)))
    counts = asyncio.run(orch.run())
    assert counts.zero_advantage["all_positive"] > 0
    assert counts.discarded["zero_advantage"] == counts.zero_advantage["all_positive"]
    kept_prompts = {g.sample_idx for b in trainer.batches for g in b.groups}
    assert kept_prompts and all(i % 2 == 1 for i in kept_prompts)
    dropped = [g for _, g in observer.groups if g.discard_reason == "zero_advantage"]
    assert all(g.zero_advantage_kind == "all_positive" for g in dropped)


def test_stale_rollouts_are_cancelled_and_aborted_on_the_server(tokenizer: Any) -> None:
    slow = {"g0-"}

    def delay(rid: str) -> float:
        return 30.0 if any(rid.startswith(p) for p in slow) else 0.0

    client = FakeClient(varied_reply(tokenizer), delay=delay)
    orch, trainer, observer = build(
        tokenizer,
        ToyEnv(varied_reward),
        client,
        max_async_rollout=2,
        max_off_policy_steps=1,
        number_of_steps=4,
    )
    start = time.time()
    counts = asyncio.run(orch.run())
    assert time.time() - start < 20, "the slow group should have been cancelled, not awaited"
    assert counts.discarded["off_policy"] == 1 and counts.cancelled_samples == 4
    assert sorted(client.aborted) == sorted(f"g0-s{i}-v0" for i in range(4))
    assert counts.aborted_requests == 4  # what the server said it aborted, not what was asked
    assert all(g.group_id != 0 for b in trainer.batches for g in b.groups)
    assert any(g.discard_reason == "off_policy" for _, g in observer.groups)


def test_bad_outputs_and_failing_rewards_are_survived(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    replies = iter(range(10**6))

    def reply(prompt: list[int], rid: str) -> list[int]:
        n = next(replies) % 4
        return [[], [eos], tokenizer.encode("<tool_call>{garbage", add_special_tokens=False), [5, 6, 7]][n]

    def reward(completion: str, sample: Any) -> Any:
        i = sample.metadata["i"]
        if i % 5 == 1:
            raise RuntimeError("reward bug")
        if i % 5 == 2:
            return asyncio.sleep(5, result=0.0)  # longer than the 0.2 s reward timeout
        return float(len(completion))

    env = ToyEnv(reward, timeout_s=0.2)
    orch, trainer, observer = build(tokenizer, env, FakeClient(reply), discard_group_zero_advantage=False)
    counts = asyncio.run(orch.run())
    assert counts.completed_steps == 3
    metrics = [s.sample_metrics for _, g in observer.groups for s in g.samples]
    assert any(m.get("reward_error") for m in metrics) and any(m.get("reward_timeout") for m in metrics)
    assert any(len(s.completion_ids) == 0 for b in trainer.batches for g in b.groups for s in g.samples)


def test_each_sample_has_a_generation_then_a_reward_span(tokenizer: Any) -> None:
    env = ToyEnv(varied_reward)
    orch, _, observer = build(
        tokenizer, env, FakeClient(varied_reply(tokenizer)), discard_group_zero_advantage=False
    )
    asyncio.run(orch.run())
    spans: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for e in observer.events:
        if e.type in ("generation", "reward"):
            spans.setdefault((e.group_id, e.sample_id), []).append((e.type, e.phase))
    finished = {(g.group_id, i) for _, g in observer.groups for i in range(len(g.samples))}
    assert finished and finished <= set(spans)
    for key in finished:  # in this order, once each
        assert spans[key] == [
            ("generation", "start"),
            ("generation", "end"),
            ("reward", "start"),
            ("reward", "end"),
        ]
    trainer_spans = [(e.phase, e.name) for e in observer.events if e.type == "trainer"]
    assert trainer_spans == [("start", "train_step"), ("end", "train_step")] * 3


def test_a_run_whose_prompts_never_fit_stops_with_the_reason(tokenizer: Any) -> None:
    from telescope.core.runtime.supervision.stall import RolloutsFailingError

    env = ToyEnv(varied_reward)
    orch, trainer, observer = build(tokenizer, env, FakeClient(varied_reply(tokenizer)), max_model_len=4)
    with pytest.raises(RolloutsFailingError) as info:
        asyncio.run(asyncio.wait_for(orch.run(), timeout=30))  # it used to cycle the dataset forever
    message = str(info.value)
    assert (
        "none of the last 200 prompt groups of environment 'toy' produced a usable rollout (prompt_too_long 200)"
        in message
    )
    assert "max_model_len=4" in message and "raise max_model_len" in message
    assert not trainer.batches and orch.counts.discarded["prompt_too_long"] == 200
    kinds = {(e.type, e.phase) for e in observer.events}  # nothing was scored
    assert ("generation", "end") in kinds and not {("reward", "start"), ("reward", "end")} & kinds


def test_the_failure_streak_resets_on_any_scored_group() -> None:
    from telescope.core.rollouts.groups import GroupFailure
    from telescope.core.runtime.supervision.stall import FailureStreak

    streak = FailureStreak(limit=3)
    assert streak.record(GroupFailure("rollout_error", "ConnectionError: refused")) is None
    assert streak.record(GroupFailure("prompt_too_long", "prompt has 9 tokens")) is None
    assert streak.record(None) is None  # a scored group (kept or zero-advantage) breaks the streak
    assert streak.record(GroupFailure("rollout_error", "a")) is None
    assert streak.record(GroupFailure("rollout_error", "b")) is None
    error = streak.record(GroupFailure("prompt_too_long", "prompt has 12 tokens"))
    assert error is not None and "(rollout_error 2, prompt_too_long 1)" in str(error)
    assert "the latest: prompt has 12 tokens" in str(error) and "inference server logs" in str(error)


def test_failure_streaks_are_kept_per_environment() -> None:
    from telescope.core.rollouts.groups import GroupFailure
    from telescope.core.runtime.supervision.stall import FailureStreaks

    streaks = FailureStreaks(limit=3)
    broken = GroupFailure("reward_error", "ZeroDivisionError")
    for _ in range(2):  # the healthy environment's successes do not reset the broken one's streak
        assert streaks.record("broken", broken) is None
        assert streaks.record("healthy", None) is None
    error = streaks.record("broken", broken)
    assert error is not None and "environment 'broken'" in str(error) and "(reward_error 3)" in str(error)
    assert "logs/telescope.log" in str(error)
