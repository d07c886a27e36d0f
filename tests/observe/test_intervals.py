"""The seed's logging intervals and blocks in the local run directory, driven by a fake clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from telescope.core.observe import LoggerHub, RolloutRecord, RunDirReader
from telescope.core.observe.hub import tick_seconds
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.rundir.jsonl import read_jsonl
from telescope.core.testing import make_config


def _local(tmp_path: Path, clock: Any, **fields: Any) -> tuple[LoggerHub, LocalLogger]:
    cfg = make_config(use_wandb=False, **fields)
    local = LocalLogger(clock=clock)
    hub = LoggerHub([local])
    hub.start(cfg, tmp_path, system_metrics=False, ticker=False)
    return hub, local


def _event_steps(path: Path) -> list[int]:
    return [e["step"] for e in read_jsonl(path)]


def test_event_blocks_rotate_at_block_duration(tmp_path: Path, clock) -> None:
    hub, _ = _local(tmp_path, clock, event_block_duration_seconds=10)
    # written at run time 0, 5, 9.9 -> block 0; 10 -> block 1; 25 -> block 2; 39.99 -> block 3
    for step, t in enumerate((0.0, 5.0, 9.9, 10.0, 25.0, 39.99)):
        clock.at(1000.0 + t)
        hub.event("trainer", step=step)
    hub.finish("finished")
    blocks = sorted(p.name for p in (tmp_path / "events").glob("block_*.jsonl.zst"))
    assert blocks == [
        "block_000000.jsonl.zst",
        "block_000001.jsonl.zst",
        "block_000002.jsonl.zst",
        "block_000003.jsonl.zst",
    ]
    assert _event_steps(tmp_path / "events" / "block_000000.jsonl.zst") == [0, 1, 2]
    assert _event_steps(tmp_path / "events" / "block_000001.jsonl.zst") == [3]
    assert _event_steps(tmp_path / "events" / "block_000003.jsonl.zst") == [5]
    assert [e["step"] for e in RunDirReader(tmp_path).events()] == [0, 1, 2, 3, 4, 5]


def test_tail_holds_the_window_and_is_rewritten_at_the_upload_interval(tmp_path: Path, clock) -> None:
    hub, _ = _local(tmp_path, clock, event_tail_window_seconds=3, event_upload_interval_seconds=2)
    tail = tmp_path / "events" / "tail.jsonl.zst"
    assert tail.read_bytes() == b""  # exists from the start
    for step in range(6):  # events written at run time 0, 1, 2, 3, 4, 5
        clock.at(1000.0 + step)
        hub.event("reward", step=step)
        if step == 1:
            hub.tick()  # t=1 < interval 2 since start: not rewritten yet
            assert tail.read_bytes() == b""
        if step == 2:
            hub.tick()  # t=2: rewritten with the events of [t-3, t] = steps 0, 1, 2
            assert _event_steps(tail) == [0, 1, 2]
    hub.tick()  # t=5: 3 s since the rewrite at t=2 >= interval 2, due again
    assert _event_steps(tail) == [2, 3, 4, 5]  # window [2, 5]
    clock.at(1005.5)
    hub.tick()  # 0.5 s since the last rewrite: not due, file unchanged
    assert _event_steps(tail) == [2, 3, 4, 5]
    clock.at(1100.0)
    hub.finish("finished")  # finish rewrites the tail: nothing in the last 3 s
    assert read_jsonl(tail) == []
    assert len(RunDirReader(tmp_path).events()) == 6  # the blocks keep everything


def test_resume_keeps_block_layout_and_numbering(tmp_path: Path, clock) -> None:
    hub, _ = _local(tmp_path, clock, event_block_duration_seconds=10, rollout_block_size=5)
    hub.event("run", name="first")
    ids = hub.run_ids()
    hub.finish("interrupted")
    clock.at(1035.0)  # 35 s after creation: block 3 of 10 s
    cfg = make_config(use_wandb=False, event_block_duration_seconds=100, rollout_block_size=50)
    hub2 = LoggerHub([LocalLogger(clock=clock)])
    hub2.start(cfg, tmp_path, ids, system_metrics=False, ticker=False)
    hub2.event("run", name="resumed")
    hub2.log_rollouts(7, [RolloutRecord(step=7, group_id=0, env="e", sample_id=0)])
    hub2.finish("finished")
    run = RunDirReader(tmp_path)
    assert run.meta["layout"] == {"rollout_block_size": 5, "event_block_duration_seconds": 10.0}
    assert [e["name"] for e in read_jsonl(tmp_path / "events" / "block_000003.jsonl.zst")] == ["resumed"]
    assert (tmp_path / "rollouts" / "block_000001.jsonl.zst").exists()  # 7 // 5, not 7 // 50
    assert [e["name"] for e in run.events()] == ["first", "resumed"]


def test_rollouts_go_to_blocks_of_rollout_block_size_steps(tmp_path: Path, clock, make_rows) -> None:
    hub, _ = _local(tmp_path, clock, rollout_block_size=3)
    for step in range(1, 8):
        hub.log_rollouts(step, make_rows(step))
    hub.finish("finished")
    steps_in = {
        p.name: sorted({r["step"] for r in read_jsonl(p)})
        for p in (tmp_path / "rollouts").glob("block_*.jsonl.zst")
    }
    assert steps_in == {
        "block_000000.jsonl.zst": [1, 2],
        "block_000001.jsonl.zst": [3, 4, 5],
        "block_000002.jsonl.zst": [6, 7],
    }
    run = RunDirReader(tmp_path)
    assert len(run.rollouts()) == 7 * len(make_rows(1))
    fresh = RunDirReader(tmp_path)
    assert {r["step"] for r in fresh.rollouts(step=4)} == {4}
    assert list(fresh.read_stats) == ["rollouts/block_000001.jsonl.zst"]  # only that step's block read


def _system(i: int) -> dict[str, Any]:
    return {"time": float(i), "node": "n", "source": "system", "metrics": {"x": float(i)}}


def test_system_samples_are_appended_every_metrics_logger_interval(tmp_path: Path, clock) -> None:
    hub, _ = _local(tmp_path, clock, metrics_logger_interval_seconds=2.0)
    system = tmp_path / "system.jsonl"
    hub.log_system(_system(0))
    clock.advance(1.0)
    hub.log_system(_system(1))
    hub.tick()  # 1 s since start < 2 s
    assert read_jsonl(system) == []
    clock.advance(1.0)
    hub.tick()  # 2 s: both buffered samples appended in one write
    assert [s["metrics"]["x"] for s in read_jsonl(system)] == [0.0, 1.0]
    hub.log_system(_system(2))
    clock.advance(0.5)
    hub.tick()
    assert len(read_jsonl(system)) == 2
    hub.log_step(1, {"reward/mean": 1.0})  # step metrics are not buffered
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 1
    hub.finish("finished")  # finish appends what is left
    assert [s["metrics"]["x"] for s in read_jsonl(system)] == [0.0, 1.0, 2.0]


def test_tick_period_follows_the_shortest_interval() -> None:
    assert (
        tick_seconds(make_config(metrics_logger_interval_seconds=2.0, event_upload_interval_seconds=5)) == 0.5
    )
    assert (
        tick_seconds(make_config(metrics_logger_interval_seconds=0.4, event_upload_interval_seconds=5)) == 0.1
    )
    assert tick_seconds(make_config(metrics_logger_interval_seconds=0.01)) == 0.05


def test_hub_tick_thread_flushes_while_running(tmp_path: Path) -> None:
    cfg = make_config(use_wandb=False, metrics_logger_interval_seconds=0.05, event_upload_interval_seconds=1)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, system_metrics=False)
    hub.log_system(_system(7))
    hub.event("run", name="live")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if read_jsonl(tmp_path / "system.jsonl") and read_jsonl(tmp_path / "events" / "tail.jsonl.zst"):
            break
        time.sleep(0.02)
    system, tail = read_jsonl(tmp_path / "system.jsonl"), read_jsonl(tmp_path / "events" / "tail.jsonl.zst")
    hub.finish("finished")
    assert [s["metrics"]["x"] for s in system] == [7.0]
    assert [e["name"] for e in tail] == ["live"]


def test_the_tail_keeps_at_most_its_byte_cap_of_the_newest_events_and_every_event_stays_in_its_block(
    tmp_path: Path,
) -> None:
    from telescope.core.observe.rundir.blocks import EventBlocks
    from telescope.core.observe.rundir.jsonl import encode_line

    now = [1000.0]
    events = [{"name": "e", "step": i, "pad": "x" * 90} for i in range(10, 60)]
    size = len(encode_line(events[0]))  # steps of two digits: every event has this length
    blocks = EventBlocks(
        tmp_path,
        origin=now[0],
        block_duration_s=3600,
        tail_window_s=600,
        tail_max_bytes=10 * size,
        clock=lambda: now[0],
    )
    for event in events:
        blocks.write([event])
        now[0] += 0.01  # all within the 600 s window: only the byte cap cuts the tail
    assert blocks.write_tail() == 10
    assert _event_steps(tmp_path / "tail.jsonl.zst") == list(range(50, 60))
    blocks.close()
    assert _event_steps(tmp_path / "block_000000.jsonl.zst") == list(range(10, 60))
