"""A frozen inference server (its requests hang, ``/health`` is silent) is diagnosed, killed and restarted.

The rule (``server_watch.server_silence``) against hand-computed values; the supervisor with
scripted fakes (no Ray): the frozen server's groups are re-queued, the run finishes every step,
restarts exhausted end it with one line. The same on the real runtime (SIGSTOP of a transformers
server) is ``test_a_frozen_server_is_killed_restarted_and_the_run_finishes`` (slow).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_healing import build_servers, run_while

from telescope.core.errors import RunStageError
from telescope.core.runtime.supervision.liveness import GroupState, RunSnapshot, SampleState
from telescope.core.runtime.supervision.server_watch import AnswerClock, server_silence, silent_servers


# --- the rule -------------------------------------------------------------------------------------
def test_the_rule_counts_silence_from_the_newer_of_the_last_answer_and_the_oldest_sample() -> None:
    recent = [1.0, 2.0, 3.0, 100.0]  # median 2.5: the limit is max(10 x 2.5, 20) = 25 s
    # last answer at 60, oldest sample from 50: silent since 60, 26 s at 86 > 25
    found = server_silence(3, [50.0, 70.0], 60.0, recent, 10.0, 20.0, now=86.0)
    assert found is not None
    assert (found.server, found.silent_s, found.generating, found.oldest_s) == (3, 26.0, 2, 36.0)
    assert (found.last_answer_ago, found.limit_s, found.median_s) == (26.0, 25.0, 2.5)
    assert server_silence(3, [50.0, 70.0], 60.0, recent, 10.0, 20.0, now=85.0) is None  # 25 s: not past
    # an old answer does not make a fresh sample overdue: silence starts with the oldest sample
    assert server_silence(0, [100.0], 10.0, recent, 10.0, 20.0, now=124.0) is None
    found = server_silence(0, [100.0], 10.0, recent, 10.0, 20.0, now=126.0)
    assert found is not None and found.silent_s == 26.0 and found.last_answer_ago == 116.0
    # the floor decides when the median is small: max(10 x 0.5, 20) = 20
    assert server_silence(0, [0.0], None, [0.5], 10.0, 20.0, now=20.0) is None
    found = server_silence(0, [0.0], None, [0.5], 10.0, 20.0, now=21.0)
    assert found is not None and found.limit_s == 20.0 and found.last_answer_ago is None
    # the factor decides when the median is large: max(10 x 4, 20) = 40
    assert server_silence(0, [0.0], None, [4.0], 10.0, 20.0, now=39.0) is None
    # nothing generating, nothing timed yet, or the rule off: never overdue
    assert server_silence(0, [], None, recent, 10.0, 20.0, now=1e9) is None
    assert server_silence(0, [0.0], None, [], 10.0, 20.0, now=1e9) is None
    assert server_silence(0, [0.0], None, recent, 0.0, 20.0, now=1e9) is None


def test_the_description_says_how_long_and_what_the_server_was_doing() -> None:
    found = server_silence(1, [0.0, 5.0], 10.0, [1.0, 1.5, 2.0], 10.0, 20.0, now=75.0)
    assert found is not None
    assert found.describe() == (
        "has not answered for 1m05s: 2 samples generating, the oldest for 1m15s, its last answer 1m05s ago; "
        "more than max(10 x median generation 1.5s, 20s) (inference_overdue_factor, inference_overdue_floor_s)"
    )


def test_silent_servers_reads_the_generating_samples_of_each_server_from_the_snapshot() -> None:
    def sample(started: float, generating: bool = True) -> SampleState:
        return SampleState(0, 0, generating, started, 1, "r")

    groups = [
        GroupState(1, "e", 0, 0, 2, [sample(0.0), sample(1.0)]),  # server 0: silent since 50 (its answer)
        GroupState(2, "e", 1, 0, 2, [sample(0.0, generating=False)]),  # server 1: only scoring
        GroupState(3, "e", 2, 0, 2, [sample(90.0)]),  # server 2: a fresh sample
    ]
    snap = RunSnapshot(3, 10, 3, 3, "waiting for a batch", 0.0, 0.0, 0, 2, 0, "", [], groups)
    clock = AnswerClock()
    clock.answered(0, 49.0, now=50.0)
    clock.answered(2, 40.0, now=41.0)  # median of [1, 1] = 1 s: the floor (20 s) decides
    found = silent_servers(snap, clock, 10.0, 20.0, now=100.0)
    assert [(s.server, s.silent_s, s.generating) for s in found] == [(0, 50.0, 2)]


# --- the supervisor, with fakes -------------------------------------------------------------------
def freeze_after(orch: Any, server: int, step: int, forever: bool = False) -> Any:
    """Freeze ``server`` right after the weight sync of step ``step`` (before any sample of the next
    step is dispatched): its requests and aborts hang, /health is silent, until it is killed.

    ``forever``: every restarted process is frozen again at once.
    """
    healer, trainer = orch.servers.healer, orch.trainer
    client = healer.clients[server]
    sync, restart = trainer.sync_weights, healer.restart

    done: list[int] = []

    async def sync_then_freeze(version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        result: dict[str, float] = await sync(version, hold)
        if version == step and not done:  # once: the restarted server is synced to this version again
            done.append(version)
            client.frozen = True
        return result

    async def restart_frozen(index: int) -> None:
        await restart(index)
        client.frozen = True

    trainer.sync_weights = sync_then_freeze
    if forever:
        healer.restart = restart_frozen
    return asyncio.sleep(3600)


@pytest.mark.parametrize("servers", [1, 2])
def test_a_frozen_server_is_killed_restarted_and_nothing_is_lost_or_trained_twice(
    tokenizer: Any, caplog: pytest.LogCaptureFixture, servers: int
) -> None:
    caplog.set_level(logging.INFO)
    # synchronous (max_async_rollout 0): frozen after a step's sync, the next batch needs the server
    orch, trainer, _, healer = build_servers(
        tokenizer, servers, number_of_steps=10, inference_overdue_floor_s=0.3, max_async_rollout=0
    )
    orch.servers.watch_every_s = 0.05
    frozen_at = time.time()
    counts = asyncio.run(asyncio.wait_for(run_while(orch, freeze_after(orch, 0, 3)), timeout=30))
    assert counts.completed_steps == 10 and counts.inference_restarts == 1
    assert [server for server, _ in healer.restarted] == [0] and healer.killed == [0]
    trained = [g.group_id for b in trainer.batches for g in b.groups]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert counts.rollout_errors == 0
    lines = [r.getMessage() for r in caplog.records if "is frozen or hung" in r.getMessage()]
    found = [line for line in lines if line.startswith("inference server 0 (pid 4000 on node 10.0.0.1)")]
    if servers == 1:  # nothing else can notice: no step, so no weight sync checks /health
        assert len(found) == 1 == len(lines), lines
        assert " has not answered for " in found[0] and " samples generating, the oldest for " in found[0]
        assert "killing it (SIGKILL) and restarting it" in found[0]
    assert time.time() - frozen_at < 30


def test_a_server_frozen_between_steps_is_named_frozen_when_the_sync_finds_it_not_died(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # server 0 stops right after step 3's train call, before the sync of version 3 checks every server
    orch, trainer, _, healer = build_servers(
        tokenizer, 2, number_of_steps=6, inference_overdue_floor_s=60.0, max_async_rollout=0
    )
    client, train = healer.clients[0], trainer.train_step

    async def train_then_freeze(step: int, batch: Any) -> dict[str, float]:
        result: dict[str, float] = await train(step, batch)
        if step == 3 and not healer.killed:  # nothing generating: only the sync's check can find it
            client.frozen = True
        return result

    trainer.train_step = train_then_freeze
    counts = asyncio.run(asyncio.wait_for(orch.run(), timeout=30))
    assert counts.completed_steps == 6 and counts.inference_restarts == 1 and healer.killed == [0]
    messages = [r.getMessage() for r in caplog.records]
    frozen = [m for m in messages if "is frozen or hung" in m]
    assert len(frozen) == 1 and re.match(
        r"inference server 0 \(pid 4000 on node 10\.0\.0\.1\) is frozen or hung: its /health does not answer "
        r"before the weight sync of version \d+ though its process runs \(0 samples generating, its last answer ",
        frozen[0],
    ), frozen
    assert "killing it (SIGKILL) and restarting it" in frozen[0]
    assert any(m.startswith("inference server 0 stopped answering (pid 4000") for m in messages), messages
    assert not any("inference server 0 died" in m for m in messages)


def test_a_crashed_server_is_still_said_to_have_died(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    orch, trainer, _, healer = build_servers(tokenizer, 2, number_of_steps=6, max_async_rollout=0)
    client, train = healer.clients[0], trainer.train_step

    async def train_then_crash(step: int, batch: Any) -> dict[str, float]:
        result: dict[str, float] = await train(step, batch)
        if step == 3 and not healer.restarted:
            client.alive = False  # the process exited
        return result

    trainer.train_step = train_then_crash
    counts = asyncio.run(asyncio.wait_for(orch.run(), timeout=30))
    assert counts.completed_steps == 6 and counts.inference_restarts == 1
    messages = [r.getMessage() for r in caplog.records]
    assert not any("is frozen or hung" in m for m in messages)
    assert any(m.startswith("inference server 0 died (pid 4000") for m in messages), messages


def test_a_server_frozen_during_a_weight_sync_is_killed_restarted_and_synced_again(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    orch, trainer, _, healer = build_servers(tokenizer, 2, number_of_steps=8, inference_overdue_floor_s=0.2)
    orch.servers.watch_every_s = 0.05
    client, sync = healer.clients[1], trainer.sync_weights
    frozen_in: list[int] = []

    async def sync_freezing_at_4(version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        if version == 4 and not frozen_in:  # server 1 stops mid-sync: its receive never answers
            frozen_in.append(version)
            client.frozen = True
            while client.alive:
                await asyncio.sleep(0.005)
            raise ConnectionError("server disconnected")  # its receive, once it was killed
        result: dict[str, float] = await sync(version, hold)
        return result

    trainer.sync_weights = sync_freezing_at_4
    counts = asyncio.run(asyncio.wait_for(orch.run(), timeout=30))
    assert counts.completed_steps == 8 and counts.inference_restarts == 1 and set(healer.killed) == {1}
    assert [server for server, _ in healer.restarted] == [1]
    assert trainer.versions.count(4) == 1  # the sync of version 4 was done again, after the restart
    lines = [r.getMessage() for r in caplog.records if "is frozen or hung" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "inference server 1 (pid 4001 on node 10.0.0.1) is frozen or hung: the weight sync of version 4 has waited "
    ), lines
    assert orch.lanes.enabled(1)  # serving again


def test_a_server_that_keeps_freezing_ends_the_run_with_one_line(tokenizer: Any) -> None:
    orch, _, _, _ = build_servers(
        tokenizer,
        1,
        number_of_steps=30,
        inference_overdue_floor_s=0.2,
        inference_max_restarts=1,
        max_async_rollout=0,
    )
    orch.servers.watch_every_s = 0.05
    with pytest.raises(RunStageError) as info:
        asyncio.run(asyncio.wait_for(run_while(orch, freeze_after(orch, 0, 2, forever=True)), timeout=60))
    message = str(info.value)
    assert "inference server 0 stopped answering 2 times (inference_max_restarts=1)" in message, message
    assert "its last log line: CUDA error" in message


def test_a_slow_server_that_answers_health_is_warned_about_not_restarted(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    orch, _, _, healer = build_servers(tokenizer, 1, number_of_steps=4, inference_overdue_floor_s=0.2)
    orch.servers.watch_every_s = 0.05
    client = healer.clients[0]
    slow = {"on": False}
    client.delay = lambda rid: 0.8 if slow["on"] else 0.01

    async def slow_down() -> None:
        while orch.counts.completed_steps < 2:
            await asyncio.sleep(0.005)
        slow["on"] = True

    counts = asyncio.run(asyncio.wait_for(run_while(orch, slow_down()), timeout=30))
    assert counts.completed_steps == 4 and counts.inference_restarts == 0 and healer.killed == []
    warned = [r.getMessage() for r in caplog.records if "its /health answers" in r.getMessage()]
    assert warned and warned[0].startswith("inference server 0 has not answered for "), warned


# --- the real runtime -----------------------------------------------------------------------------
def logged_at(line: str) -> float:
    """The time of a ``logs/telescope.log`` line (``2026-11-26 21:14:47,464 INFO ...``, local time)."""
    return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


@pytest.mark.slow
def test_a_frozen_server_is_killed_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import yaml
    from rundriver import actor_pids, finish, launch, pid_alive, read_jsonl, run_meta, settings, wait_for
    from test_trainer_freeze import gone, steps_logged
    from typer.testing import CliRunner

    from telescope.cli.app import app
    from telescope.cli.health import run_health

    steps, floor = 60, 15.0
    run_dir, log, config = tmp_path / "run", tmp_path / "cli.log", tmp_path / "run.yaml"
    # synchronous (max_async_rollout 0): no batch is ready ahead. Frozen while its samples generate,
    # the watch finds it (generations of 8 tokens, under a second: the floor decides); frozen while
    # the trainer trains, the next weight sync's check of every server finds it first (the step is
    # short: both happen). stall_timeout_s far beyond what healing needs
    cfg = settings(
        run_dir,
        number_of_steps=steps,
        inference_overdue_floor_s=floor,
        max_async_rollout=0,
        stall_timeout_s=600,
    )
    config.write_text(yaml.safe_dump(cfg))
    proc = launch(config, log)
    wait_for(lambda: steps_logged(run_dir) >= 5, proc, log, timeout_s=400)
    (actor,) = actor_pids(proc.pid, "InferenceServerWorker")
    (victim,) = children(actor)  # the server process (its own session, started by the actor)
    os.kill(victim, signal.SIGSTOP)
    frozen_at, done_at_freeze = time.time(), steps_logged(run_dir)
    try:
        time.sleep(floor + 2)  # meanwhile `runs show` does not look green: the step runs long
        shown = CliRunner().invoke(app, ["runs", "show", str(run_dir)], env={"COLUMNS": "250"}).output
        health = run_health(run_meta(run_dir), time.time())
        assert finish(proc, log, 300) == 0, log.read_text()[-4000:]
        killed = gone(victim)
    finally:
        if pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
    finished = time.time()
    assert killed  # no frozen process left behind
    text = (run_dir / "logs" / "telescope.log").read_text()
    lines = [line for line in text.splitlines() if "inference server 0" in line and "frozen or hung" in line]
    assert len(lines) == 1, text[-4000:]
    # three places find it: the check of every server before a weight sync, the weight sync itself
    # (frozen while it broadcast: it waited the floor), or the watch of generating samples
    paths = {
        "the check before the sync": " before the weight sync of version ",
        "the sync": " has waited ",
        "the watch": " has not answered for ",
    }
    found = [name for name, words in paths.items() if words in lines[0]]
    assert len(found) == 1, lines[0]
    path = found[0]
    by_sync = path != "the watch"
    assert f"inference server 0 (pid {victim} on node " in lines[0]
    assert "killing it (SIGKILL) and restarting it" in lines[0]
    restarted = [line for line in text.splitlines() if "inference server 0 stopped answering (pid" in line]
    assert restarted and "restarting it (1 of 3)" in restarted[0]
    detected = logged_at(lines[0]) - frozen_at
    stepped = [line for line in text.splitlines() if " telescope.progress step " in line]
    healed = next(logged_at(line) for line in stepped if logged_at(line) > logged_at(lines[0])) - frozen_at
    meta = run_meta(run_dir)
    assert meta["status"] == "finished" and meta["starts"] == 1
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted({int(r["step"]) for r in rows}) == list(range(1, steps + 1))
    step = done_at_freeze + 1
    print(
        f"frozen after step {done_at_freeze}: diagnosed by {path} "
        f"{detected:.0f}s after the freeze, the next step "
        f"{healed:.0f}s after it, all {steps} steps finished {finished - frozen_at:.0f}s after it; "
        f"runs show at {floor + 2:g}s: {health['state']} ({health['text']})"
    )
    # the watch: the floor, then /health asked twice (10 s each); the sync: /health asked twice, at
    # once before it, or after the floor within it (which may have begun before the freeze)
    assert (0 if by_sync else floor) < detected < floor + 45
    # the step after the last one logged when frozen (or the one after it, had it just finished)
    running = next(
        (f"step {n} running for " for n in (step, step + 1) if f"step {n} running for " in shown), None
    )
    assert running is not None and running in health["text"], shown
    assert health["state"] in ("slow", "overdue"), health
    assert finished - frozen_at < 180
