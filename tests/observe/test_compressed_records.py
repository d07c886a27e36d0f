"""Rollout and event blocks as zstd frames: what is written, what a killed or damaged file still
gives back, live tailing, old plain run directories, and the size won."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import zstandard

from telescope.core.observe import LoggerHub, RolloutRecord, RunDirReader
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.rundir.jsonl import JsonlReadStats, ZstdJsonlWriter, read_jsonl
from telescope.core.observe.rundir.tail import FrameTail
from telescope.core.testing import make_config


def _records(n: int, step: int = 0) -> list[dict[str, Any]]:
    return [
        {"step": step, "i": i, "text": f"row {i} of step {step}", "ids": list(range(i % 7))} for i in range(n)
    ]


def _plain_lines(records: list[dict[str, Any]]) -> bytes:
    """Compact strict JSON (no spaces after separators), as the run directory writes it."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()


def _zstd_stream(path: Path) -> bytes:
    """The file decompressed by zstandard's own multi-frame reader (not ours)."""
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()


def _frame(records: list[dict[str, Any]]) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(_plain_lines(records))


def test_each_write_is_whole_standard_zstd_frames_of_the_jsonl_lines(tmp_path: Path) -> None:
    path = tmp_path / "block_000000.jsonl.zst"
    writer = ZstdJsonlWriter(path)
    first, second = _records(5, step=1), _records(3, step=2) + [{"step": 2, "nan": float("nan"), "u": "é"}]
    writer.write_many(first)
    size_after_first = path.stat().st_size
    writer.write_many(second)
    writer.close()
    expected = _plain_lines(first) + _plain_lines(second[:3]) + b'{"step":2,"nan":null,"u":"\xc3\xa9"}\n'
    assert _zstd_stream(path) == expected  # any zstd reader (zstdcat) gets the JSONL back
    with open(path, "rb") as f:  # the first write alone is one complete frame
        assert zstandard.ZstdDecompressor().decompressobj().decompress(
            f.read(size_after_first)
        ) == _plain_lines(first)
    stats = JsonlReadStats()
    assert read_jsonl(path, stats) == [*first, *second[:3], {"step": 2, "nan": None, "u": "é"}]
    assert stats.records == 9 and not stats.problems()


def test_a_torn_last_frame_loses_only_that_write_and_a_resumed_writer_appends_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "block_000000.jsonl.zst"
    with open(path, "wb") as f:
        f.write(_frame(_records(4, step=1)) + _frame(_records(4, step=2)))
    torn = _frame(_records(50, step=3))
    for cut in (1, 4, 9, len(torn) // 2, len(torn) - 1):  # anywhere, even inside the frame header
        damaged = tmp_path / f"cut{cut}.jsonl.zst"
        damaged.write_bytes(path.read_bytes() + torn[:cut])
        stats = JsonlReadStats()
        assert read_jsonl(damaged, stats) == _records(4, step=1) + _records(4, step=2), cut
        assert stats.torn_tail and stats.skipped_frames == 0, cut
        # the run resumes: its writer appends after the torn bytes, which stay where they are
        writer = ZstdJsonlWriter(damaged)
        writer.write_many(_records(2, step=3))
        writer.close()
        stats = JsonlReadStats()
        assert [r["step"] for r in read_jsonl(damaged, stats)] == [1] * 4 + [2] * 4 + [3] * 2, cut
        assert (stats.skipped_frames, stats.skipped_bytes, stats.torn_tail) == (1, cut, False), cut
        assert "1 torn or corrupt compressed frame(s) skipped" in stats.problems()


def test_a_corrupt_frame_is_counted_and_the_frames_after_it_are_read(tmp_path: Path) -> None:
    frames = [_frame(_records(20, step=s)) for s in range(4)]
    bad = bytearray(frames[1])
    bad[len(bad) // 2] ^= 0x5A  # a flipped byte: the content checksum no longer matches
    path = tmp_path / "block_000000.jsonl.zst"
    path.write_bytes(frames[0] + bytes(bad) + frames[2] + frames[3])
    stats = JsonlReadStats()
    rows = read_jsonl(path, stats)
    assert sorted({r["step"] for r in rows}) == [0, 2, 3] and len(rows) == 60
    assert (stats.skipped_frames, stats.skipped_bytes, stats.torn_tail) == (1, len(bad), False)
    # garbage that is no frame at all between good frames: skipped the same way
    path.write_bytes(frames[0] + b"\x00garbage" * 100 + frames[3])
    stats = JsonlReadStats()
    assert [r["step"] for r in read_jsonl(path, stats)] == [0] * 20 + [3] * 20
    assert stats.skipped_frames == 1 and stats.skipped_bytes == 800


def test_the_tail_follows_frames_as_they_are_appended_and_reads_lines_back(tmp_path: Path) -> None:
    path = tmp_path / "block_000000.jsonl.zst"
    tail = FrameTail(path)
    assert tail.read_lines() == ([], False)  # not there yet
    one, two = _frame(_records(3, step=1)), _frame(_records(2, step=2))
    with open(path, "ab") as f:
        f.write(one + two[:10])  # the second frame is being written
        f.flush()
        lines, reset = tail.read_lines()
        assert [json.loads(ln.data) for ln in lines] == _records(3, step=1) and not reset
        assert tail.torn_tail and tail.pending() and tail.read_lines() == ([], False)
        f.write(two[10:])
    lines2, _ = tail.read_lines()
    assert [json.loads(ln.data) for ln in lines2] == _records(2, step=2) and not tail.torn_tail
    every = lines + lines2
    assert tail.read_at([(ln.offset, len(ln.data)) for ln in reversed(every)]) == [
        ln.data for ln in reversed(every)
    ]
    # replaced by a shorter file (the tail file is rewritten by rename): read again from the start
    fresh = tmp_path / "new.zst"
    fresh.write_bytes(_frame(_records(1, step=9)))
    os.replace(fresh, path)
    lines, reset = tail.read_lines()
    assert reset and [json.loads(ln.data) for ln in lines] == _records(1, step=9)


def _hub(run_dir: Path, **fields: Any) -> LoggerHub:
    hub = LoggerHub([LocalLogger()])
    hub.start(make_config(use_wandb=False, **fields), run_dir, system_metrics=False, ticker=False)
    return hub


def test_events_are_appended_at_each_tick_as_one_frame(tmp_path: Path) -> None:
    hub = _hub(tmp_path)
    block = tmp_path / "events" / "block_000000.jsonl.zst"
    for i in range(3):
        hub.event("generation", "start", step=1, group_id=0, sample_id=i)
    assert not block.exists() or read_jsonl(block) == []  # buffered until the tick
    hub.tick()
    size = block.stat().st_size
    assert [e["sample_id"] for e in read_jsonl(block)] == [0, 1, 2]
    assert zstandard.get_frame_parameters(block.read_bytes()).content_size > 0
    with open(block, "rb") as f:  # one frame holds all three
        assert zstandard.ZstdDecompressor().decompressobj().decompress(f.read(size)).count(b"\n") == 3
    hub.event("run", name="last")
    hub.finish("finished")  # finish appends what is left
    assert [e["type"] for e in RunDirReader(tmp_path).events()] == ["generation"] * 3 + ["run"]


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from telescope.core.observe import LoggerHub, RolloutRecord
    from telescope.core.observe.loggers.local import LocalLogger
    from telescope.core.testing import make_config

    hub = LoggerHub([LocalLogger()])
    cfg = make_config(use_wandb=False, rollout_block_size=1000)
    hub.start(cfg, Path(sys.argv[1]), system_metrics=False, ticker=True)
    step = 0
    while True:
        rows = [
            RolloutRecord(step=step, group_id=g, env="e", sample_id=s, completion_text="x" * (50 + 97 * s),
                          completion_ids=list(range(200)))
            for g in range(8) for s in range(8)
        ]
        hub.log_rollouts(step, rows)
        hub.event("trainer", "instant", step=step)
        if step == 5:
            print("ready", flush=True)
        step += 1
    """
)


def test_a_run_killed_with_sigkill_keeps_every_complete_frame(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    run = RunDirReader(run_dir)
    rows = run.rollouts()
    steps = sorted({r["step"] for r in rows})
    assert steps == list(range(len(steps))) and len(steps) > 5  # every step up to the kill, no gap
    assert all(sum(r["step"] == s for r in rows) == 64 for s in steps)  # each step whole: one frame
    events = run.events()
    assert [e["step"] for e in events] == list(range(len(events)))  # in order, no gap
    assert not any(stats.skipped_frames or stats.bad_lines for stats in run.read_stats.values())


def _rollouts(n: int, step: int) -> list[dict[str, Any]]:
    return [
        RolloutRecord(step=step, group_id=0, env="e", sample_id=i, time=float(i)).to_dict() for i in range(n)
    ]


def test_an_old_plain_run_directory_reads_as_before_and_a_resume_adds_compressed_blocks(
    tmp_path: Path,
) -> None:
    root = tmp_path / "old"
    (root / "rollouts").mkdir(parents=True)
    (root / "events").mkdir()
    meta = {"schema_version": 2, "run_id": "old", "name": "old", "status": "interrupted", "created_at": 0.0}
    meta["layout"] = {"rollout_block_size": 10, "event_block_duration_seconds": 1e9}
    (root / "run.json").write_text(json.dumps(meta))
    (root / "rollouts" / "block_000000.jsonl").write_bytes(_plain_lines(_rollouts(3, step=1)))
    (root / "events" / "block_000000.jsonl").write_bytes(_plain_lines([{"type": "run", "name": "first"}]))
    (root / "events" / "tail.jsonl").write_bytes(_plain_lines([{"type": "run", "name": "first"}]))
    old = RunDirReader(root)
    assert old.rollouts() == _rollouts(3, step=1) and old.rollouts(step=1) == _rollouts(3, step=1)
    assert old.events_tail() == [{"type": "run", "name": "first"}]
    hub = LoggerHub([LocalLogger()])  # a newer Telescope resumes it
    hub.start(make_config(use_wandb=False), root, {"run_id": "old"}, system_metrics=False, ticker=False)
    hub.log_rollouts(2, _rollouts(2, step=2))
    hub.event("run", name="resumed")
    hub.finish("finished")
    assert sorted(p.name for p in (root / "rollouts").iterdir()) == [
        "block_000000.jsonl",
        "block_000000.jsonl.zst",
    ]
    assert not (root / "events" / "tail.jsonl").exists()  # the stale plain tail is gone
    run = RunDirReader(root)
    assert [r["step"] for r in run.rollouts()] == [1, 1, 1, 2, 2]  # the plain block first
    assert run.rollouts(step=2) == _rollouts(2, step=2)
    assert [e["name"] for e in run.events()] == ["first", "resumed"]
    assert [e["name"] for e in run.events_tail()] == ["resumed"]


def test_compressed_rollouts_are_several_times_smaller(tmp_path: Path) -> None:
    rows = [
        {
            "step": 1,
            "group_id": g,
            "sample_id": s,
            "prompt_text": "<|im_start|>user\nReverse the text: ocean smile<|im_end|>\n<|im_start|>assistant\n",
            "prompt_ids": [1, 85, 369, 79, 201, 52, 71, 310, 307, 71, 261, 345, 86, 16, 2, 201],
            "completion_text": f"elims naeco {g * s}",
            "completion_ids": [288, 268, 85, 307, 351, 301, 67, g, s, 2],
            "completion_logprobs": [round(-0.1 * ((g * 7 + s * 3 + k) % 13), 4) for k in range(10)],
            "reward": (g * s % 5) / 5,
        }
        for g in range(16)
        for s in range(8)
    ]
    path = tmp_path / "block_000000.jsonl.zst"
    writer = ZstdJsonlWriter(path)
    writer.write_many(rows)
    writer.close()
    assert len(_plain_lines(rows)) >= 4 * path.stat().st_size


def test_the_tail_reads_a_big_file_in_bounded_pieces_of_whole_frames(tmp_path: Path) -> None:
    path = tmp_path / "block_000000.jsonl.zst"
    steps = [_records(40, step=s) for s in range(30)]
    path.write_bytes(b"".join(_frame(rows) for rows in steps))
    limit = 3 * len(_plain_lines(steps[0]))  # about three frames of content per read
    tail, reads = FrameTail(path), []
    while True:
        lines, _ = tail.read_lines(limit=limit)
        if not lines:
            break
        reads.append([json.loads(ln.data) for ln in lines])
    assert [r for read in reads for r in read] == [r for rows in steps for r in rows]
    assert len(reads) >= 9 and all(len(read) % 40 == 0 and len(read) <= 4 * 40 for read in reads)
    assert not tail.pending() and not tail.torn_tail


def test_a_file_the_opener_refuses_is_never_read_nor_pending(tmp_path: Path) -> None:
    path = tmp_path / "block_000000.jsonl.zst"
    path.write_bytes(_frame(_records(3, step=1)))

    def refuse(p: Path) -> Any:
        raise ValueError(f"refused {p}: outside the run")

    tail = FrameTail(path, refuse)
    assert tail.read_lines() == ([], False) and not tail.pending()
    assert tail.refused == f"refused {path}: outside the run"
    assert len(FrameTail(path).read_lines()[0]) == 3  # the default opener reads it
