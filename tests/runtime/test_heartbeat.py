"""The overdue-step rule and the trainer heartbeats (``runtime/supervision/heartbeat.py``), without Ray
processes: a step is overdue past ``max(factor x median, floor)``; then a silent or busy rank is a hung
trainer (named with its phase), idle ranks only a warning."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from telescope.core.runtime.supervision.heartbeat import (
    SILENT_AFTER_S,
    Beat,
    PhaseClock,
    RankView,
    TrainerHungError,
    TrainerWatch,
    diagnose,
    overdue_limit,
)
from telescope.core.runtime.supervision.liveness import RunSnapshot
from telescope.core.testing import make_config

ray = pytest.importorskip("ray")

# Five recorded step durations; sorted 0.4, 0.45, 0.5, 0.6, 3.0: the median is 0.5 (the 3 s outlier,
# a step with a checkpoint, does not move it).
RECENT = [0.6, 0.4, 3.0, 0.45, 0.5]


def test_overdue_limit_is_factor_times_the_median_with_a_floor() -> None:
    assert overdue_limit(RECENT, factor=10, floor_s=60) == 60.0  # 10 x 0.5 = 5 s is under the floor
    assert overdue_limit(RECENT, factor=10, floor_s=2) == 5.0
    assert overdue_limit(RECENT, factor=200, floor_s=60) == 100.0
    assert overdue_limit([1.0, 2.0, 3.0, 10.0], factor=10, floor_s=0) == 25.0  # even count: (2 + 3) / 2
    assert overdue_limit([], factor=10, floor_s=60) is None  # no step timed yet: the rule waits
    assert overdue_limit(RECENT, factor=0, floor_s=60) is None  # 0 turns it off


def snap(running_for: float, now: float, stage: str = "train_step", done: int = 6) -> RunSnapshot:
    return RunSnapshot(
        done, 20, done + 1, done, stage, now - running_for, now - running_for, 0, 16, 0, "", [], []
    )


def beat(rank: int, phase: str, for_s: float, at: float, last: str = "") -> Beat:
    return Beat(rank, 100 + rank, "node-a", phase, for_s, last, at)


NOW = 10_000.0


def test_a_silent_rank_in_an_overdue_step_is_a_hung_trainer_named_with_its_phase() -> None:
    ranks = [
        RankView(0, beat(0, "train_step (step 7)", 58.0, NOW - 1), unanswered_s=0.5),
        RankView(1, beat(1, "", 0.3, NOW - 59.5, last="send_weights (version 6)"), unanswered_s=59.0),
    ]
    limit = 60.0  # max(10 x 0.5, 60)
    assert diagnose(snap(limit - 0.1, NOW), ranks, RECENT, 10, 60, NOW) is None
    found = diagnose(snap(limit + 1, NOW), ranks, RECENT, 10, 60, NOW)
    assert isinstance(found, TrainerHungError)
    assert str(found) == (
        "step 7 is overdue: running for 1m01s, more than max(10 x median step 0.5s, 60s) "
        "(trainer_overdue_factor, trainer_overdue_floor_s), the trainer loop in 'train_step'; "
        "trainer rank 1 (pid 101) has not answered a heartbeat for 59s (frozen or hung; its last "
        "answer: idle for 0.3s after send_weights (version 6)); trainer rank 0 (pid 100) in "
        "train_step (step 7) for 59s. If steps this slow are expected, raise trainer_overdue_factor "
        "or trainer_overdue_floor_s (trainer_overdue_factor 0 turns this check off)"
    )
    assert found.ranks == [1] and found.silent == [ranks[1].beat]


def test_ranks_busy_past_the_limit_hang_idle_ranks_only_warn() -> None:
    # a collective that never returns: every rank answers, every one is in train_step
    busy = [RankView(r, beat(r, "train_step (step 7)", 100.0, NOW), 0.0) for r in (0, 1)]
    found = diagnose(snap(101.0, NOW), busy, RECENT, 200, 60, NOW)  # limit 200 x 0.5 = 100 s
    assert isinstance(found, TrainerHungError) and found.ranks == [0, 1] and found.silent == []
    assert diagnose(snap(99.0, NOW), busy, RECENT, 200, 60, NOW) is None
    idle = [RankView(r, beat(r, "", 100.0, NOW), 0.0) for r in (0, 1)]
    warning = diagnose(snap(101.0, NOW, stage="waiting for a batch"), idle, RECENT, 200, 60, NOW)
    assert isinstance(warning, str) and warning.endswith("every trainer rank is idle: not a trainer hang")
    # a silence shorter than SILENT_AFTER_S is an answer on its way, not a frozen rank
    slow_answer = [RankView(0, beat(0, "", 1.0, NOW), SILENT_AFTER_S - 1)]
    assert isinstance(diagnose(snap(101.0, NOW), slow_answer, RECENT, 200, 60, NOW), str)


def test_the_rule_waits_before_training_after_the_last_step_and_without_timed_steps() -> None:
    silent = [RankView(0, None, 999.0)]
    assert diagnose(snap(999.0, NOW, stage="starting"), silent, RECENT, 10, 60, NOW) is None
    assert diagnose(snap(999.0, NOW, done=20), silent, RECENT, 10, 60, NOW) is None  # evals after training
    assert diagnose(snap(999.0, NOW), silent, [], 10, 60, NOW) is None
    found = diagnose(snap(999.0, NOW), silent, RECENT, 10, 60, NOW)
    assert isinstance(found, TrainerHungError) and "trainer rank 0 has not answered a heartbeat" in str(found)
    assert found.silent == []  # never heard from: no pid to kill, Ray's kill of the actor remains


def test_the_phase_clock_names_what_the_rank_runs() -> None:
    clock = PhaseClock()
    assert clock.beat()["phase"] == "" and clock.beat()["last"] == ""
    with clock.phase("train_step (step 3)"):
        time.sleep(0.05)
        now = clock.beat()
        assert now["phase"] == "train_step (step 3)" and now["for_s"] >= 0.05
    after = clock.beat()
    assert after["phase"] == "" and after["last"] == "train_step (step 3)" and after["for_s"] < 0.05


class Actor:
    """A trainer actor whose heartbeat answers are set by the test (``answer``; None: no answer)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.answer: Any = {"phase": "", "for_s": 0.0, "last": ""}
        self.asked = 0
        self.heartbeat = self

    def options(self, concurrency_group: str) -> Actor:
        assert concurrency_group == "health"
        return self

    def remote(self) -> asyncio.Future[Any]:
        self.asked += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(self.answer, BaseException):
            future.set_exception(self.answer)
        elif self.answer is not None:
            future.set_result({**self.answer, "rank": self.rank, "pid": 100 + self.rank, "node_id": "n"})
        return future


def watch_of(actors: list[Actor], now: list[float], snapshot: RunSnapshot) -> tuple[TrainerWatch, list[Any]]:
    failures: list[Any] = []
    cfg = make_config(trainer_overdue_factor=10, trainer_overdue_floor_s=60)
    watch = TrainerWatch(actors, cfg, lambda: snapshot, lambda: RECENT, failures.append, clock=lambda: now[0])
    return watch, failures


def test_the_watch_fails_the_training_when_a_rank_stops_answering_in_an_overdue_step() -> None:
    async def scenario() -> None:
        now = [NOW]
        actors = [Actor(0), Actor(1)]
        actors[0].answer = {"phase": "train_step (step 7)", "for_s": 1.0, "last": ""}
        watch, failures = watch_of(actors, now, snap(30.0, NOW))
        assert await watch.tick() and await watch.tick()  # asked, then answered: both heard
        assert [b.phase for b in (watch.beats[0], watch.beats[1])] == ["train_step (step 7)", ""]
        actors[1].answer = None  # frozen from here on
        await watch.tick()
        await watch.tick()
        now[0] = NOW + 31.0  # the step has run 61 s > max(10 x 0.5, 60)
        assert not await watch.tick()
        (hung,) = failures
        assert isinstance(hung, TrainerHungError) and hung.ranks == [1]
        assert "trainer rank 1 (pid 101) has not answered a heartbeat for 31s" in str(hung)
        assert actors[1].asked == 3  # one question in flight at a time: a frozen rank is not flooded

    asyncio.run(scenario())


def test_the_watch_reports_a_dead_rank_at_once() -> None:
    async def scenario() -> None:
        now = [NOW]
        actors = [Actor(0)]
        watch, failures = watch_of(actors, now, snap(1.0, NOW))
        died = ray.exceptions.ActorDiedError()
        actors[0].answer = died
        await watch.tick()
        assert not await watch.tick() and failures == [died]

    asyncio.run(scenario())


def test_an_overdue_step_with_idle_ranks_is_one_warning_per_step(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[str]:
        now = [NOW]
        snapshot = snap(61.0, NOW, stage="waiting for a batch")
        watch, failures = watch_of([Actor(0)], now, snapshot)
        for _ in range(4):
            assert await watch.tick()
        assert failures == []
        return [r.getMessage() for r in caplog.records if "is overdue" in r.getMessage()]

    with caplog.at_level("WARNING", logger="telescope.runtime"):
        (line,) = asyncio.run(scenario())
    assert line.startswith("step 7 is overdue: running for 1m01s") and "every trainer rank is idle" in line
    assert line.endswith("(the stall watchdog ends the run at stall_timeout_s: 1800s)")


def test_a_rank_that_just_began_its_phase_in_an_overdue_step_is_not_hung() -> None:
    # the step waited 3m38s for a restarted vLLM server, then the rank began the re-sync: not stuck
    syncing = [RankView(0, beat(0, "send_weights (version 2)", 0.1, NOW), 0.0)]
    warning = diagnose(snap(218.0, NOW), syncing, RECENT, 10, 60, NOW)
    assert isinstance(warning, str) and warning.endswith(
        "trainer rank 0 (pid 100) in send_weights (version 2) for 0.1s: in its phase for less than "
        "that, not a trainer hang"
    )
    # in that phase for the limit (60 s, counted to now from its answer 2 s ago): stuck
    stuck = [RankView(0, beat(0, "send_weights (version 2)", 58.0, NOW - 2), 0.0)]
    found = diagnose(snap(218.0, NOW), stuck, RECENT, 10, 60, NOW)
    assert isinstance(found, TrainerHungError) and found.ranks == [0]
