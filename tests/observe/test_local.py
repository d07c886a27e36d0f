"""The local run directory: every file, its documented schema, and crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from telescope.core.observe import SCHEMA_VERSION, LoggerHub, RunDirError, RunDirReader
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.rundir.jsonl import JsonlReadStats, JsonlWriter, read_jsonl

ROLLOUT_FIELDS = {
    "step",
    "group_id",
    "env",
    "sample_id",
    "prompt_text",
    "prompt_ids",
    "completion_text",
    "completion_ids",
    "reward",
    "raw_reward",
    "sample_metrics",
    "advantage",
    "model_version",
    "off_policy_steps",
    "stop_reason",
    "discard_reason",
    "zero_advantage_kind",
    "server",
    "lane",
    "timings",
    "prompt_idx",
    "num_turns",
    "time",
    "kept",
    "prompt_tokens",
    "completion_tokens",
    "env_stop_reason",
    "golden_answers",
    "info_turns",
    "sample_tags",
}
EVENT_FIELDS = {
    "type",
    "phase",
    "name",
    "step",
    "group_id",
    "sample_id",
    "server",
    "lane",
    "rank",
    "time",
    "attrs",
}


def test_every_file_with_documented_schema(synthetic_run: Path, cfg) -> None:
    names = {p.name for p in synthetic_run.iterdir()}
    assert {
        "run.json",
        "config.yaml",
        "metrics.jsonl",
        "system.jsonl",
        "rollouts",
        "events",
        "evals",
    } <= names
    assert {p.name for p in (synthetic_run / "events").iterdir()} == {
        "block_000000.jsonl.zst",
        "tail.jsonl.zst",
    }
    assert {p.name for p in (synthetic_run / "rollouts").iterdir()} == {"block_000000.jsonl.zst"}
    assert {p.name for p in (synthetic_run / "evals").iterdir()} == {"metrics.jsonl", "samples.jsonl"}
    meta = json.loads((synthetic_run / "run.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION == 3 and meta["status"] == "finished"
    assert meta["layout"] == {"rollout_block_size": 500, "event_block_duration_seconds": 1800.0}
    assert meta["name"] == "synthetic" and meta["finished_at"] >= meta["started_at"]
    assert meta["info"]["environments"][0]["reward_max"] == 1.0
    assert meta["info"]["reward_ranges"] == {"reverse_text": {"min": None, "max": None}}
    config = yaml.safe_load((synthetic_run / "config.yaml").read_text())
    assert config == cfg.model_dump(mode="json")
    steps = read_jsonl(synthetic_run / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert set(steps[0]) == {"step", "time", "metrics"} and steps[0]["metrics"]["entropy"] == 1.0
    rollouts = read_jsonl(synthetic_run / "rollouts" / "block_000000.jsonl.zst")
    assert len(rollouts) == 4 * 13 and all(set(r) == ROLLOUT_FIELDS for r in rollouts)
    first = rollouts[0]
    assert first["prompt_ids"] == [1, 2, 3] and first["completion_tokens"] == 5 and first["kept"] is True
    events = read_jsonl(synthetic_run / "events" / "block_000000.jsonl.zst")
    assert read_jsonl(synthetic_run / "events" / "tail.jsonl.zst") == events  # all within the last 60 s
    assert all(set(e) == EVENT_FIELDS for e in events)
    trainer_end = [e for e in events if e["type"] == "trainer" and e["phase"] == "end"]
    assert len(trainer_end) == 4 and trainer_end[0]["attrs"]["duration_s"] >= 0
    gen = [e for e in events if e["type"] == "generation"]
    assert {(e["phase"], e["server"], e["lane"]) for e in gen} == {("start", 0, 0), ("end", 0, 0)}


def test_log_files_capture_telescope_loggers(tmp_path: Path, cfg) -> None:
    import logging

    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, system_metrics=False)
    logging.getLogger("telescope.orchestrator").info("hello info")
    logging.getLogger("telescope.orchestrator").debug("hello debug")
    hub.warn("disk almost full")
    hub.finish("failed")
    logging.getLogger("telescope.orchestrator").info("after finish")
    info = (tmp_path / "logs" / "telescope.log").read_text()
    detailed = (tmp_path / "logs" / "telescope.detailed.log").read_text()
    assert "hello info" in info and "hello debug" not in info and "disk almost full" in info
    assert "hello debug" in detailed and "test_local.py:" in detailed
    assert "after finish" not in info
    assert RunDirReader(tmp_path).meta["status"] == "failed"


def test_step_lines_and_start_up_summary_reach_telescope_log(tmp_path: Path, capsys) -> None:
    from telescope.core.inference.auto import startup_summary
    from telescope.core.testing import make_config

    cfg = make_config(number_of_steps=3, inference_num_workers=1, trainer_num_workers=2, use_wandb=False)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, system_metrics=False)
    summary = startup_summary(cfg, "transformers", "set in the config")  # as the runtime reports it
    hub.log_info(
        {
            "setup": {
                "inference_engine": "transformers",
                "why": "set in the config",
                "plugins": [],
                "summary": summary.line,
                "notes": [*summary.notes, "a note only the runtime knows"],
            }
        }
    )
    for step in (1, 2, 3):
        hub.log_step(step, {"reward/mean": step / 10, "discarded/count": 1})
    hub.finish("finished")
    lines = (tmp_path / "logs" / "telescope.log").read_text().splitlines()
    said = [ln.split(" telescope.progress ", 1)[1] for ln in lines if " INFO telescope.progress " in ln]
    start = [s for s in said if s.startswith(("start: ", "note: "))]
    assert start[0] == (
        f"start: model {cfg.model}, algorithm {cfg.algorithm}, backend {cfg.train_backend}, engine "
        f"transformers (set in the config), 1 inference + 2 trainer workers, 3 steps, run dir "
        f"{cfg.resolved_run_dir}"
    )
    # the runtime's summary as it was sent, not one the logger worked out again
    assert start[1:] == [f"note: {n}" for n in summary.notes] + ["note: a note only the runtime knows"]
    assert summary.notes[0].startswith("dtypes: master weights")
    steps = [ln.split(" telescope.progress ", 1)[1] for ln in lines if "telescope.progress step " in ln]
    assert [s.split(" | ")[0] for s in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert steps[1].startswith("step 2/3 | ETA ") and "reward 0.2000" in steps[1]
    assert steps[2].endswith("discarded 3 | cancelled 0") and "ETA 0s" in steps[2]
    assert "step 1/3" not in capsys.readouterr().err  # telescope.log only: the console prints its own


def test_system_samples_written(tmp_path: Path) -> None:
    from telescope.core.testing import make_config

    cfg = make_config(
        system_metrics_collection_interval_seconds=0.02, metrics_logger_interval_seconds=0.05, use_wandb=False
    )
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path)
    deadline = time.monotonic() + 10
    while len(RunDirReader(tmp_path).system()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    hub.finish("finished")
    samples = RunDirReader(tmp_path).system()
    assert len(samples) >= 3
    m = samples[-1]["metrics"]
    assert 0.0 <= m["cpu_utilization_percent"] <= 100.0
    assert m["system_memory_used_gb"] > 0 and 0 < m["system_memory_percent"] < 100


def test_resume_keeps_run_id_and_appends(tmp_path: Path, cfg) -> None:
    first = LoggerHub([LocalLogger()])
    first.start(cfg, tmp_path, system_metrics=False)
    first.log_step(1, {"x": 1.0})
    ids = first.run_ids()
    first.finish("interrupted")
    second = LoggerHub([LocalLogger()])
    second.start(cfg, tmp_path, ids, system_metrics=False)
    second.log_step(2, {"x": 2.0})
    second.finish("finished")
    run = RunDirReader(tmp_path)
    assert run.meta["run_id"] == ids["local"]["run_id"] and run.meta["starts"] == 2
    assert [s["step"] for s in run.steps()] == [1, 2]


_WRITER_SCRIPT = r"""
import sys, time
from telescope.core.observe import LoggerHub, RolloutRecord
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.testing import make_config
cfg = make_config(system_metrics_collection_interval_seconds=0.01, use_wandb=False)
hub = LoggerHub([LocalLogger()])
hub.start(cfg, sys.argv[1])
step = 0
while True:
    step += 1
    rows = [RolloutRecord(step=step, group_id=0, env="e", sample_id=i, completion_text="x" * 5000,
                          completion_ids=list(range(500))) for i in range(4)]
    hub.log_rollouts(step, rows)
    hub.event("trainer", "instant", step=step)
    hub.log_step(step, {"reward/mean": step / 10})
    print(f"printed after step {step}")
"""


def test_killed_writer_leaves_readable_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER_SCRIPT, str(run_dir)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(read_jsonl(run_dir / "metrics.jsonl")) >= 20:
                break
            assert proc.poll() is None, "writer exited early"
            time.sleep(0.05)
        else:
            pytest.fail("writer produced no steps in 60 s")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    run = RunDirReader(run_dir)
    assert run.meta["status"] == "running"  # never finished
    steps = run.steps()
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    rows = run.rollouts()
    assert all(len(r["completion_ids"]) == 500 for r in rows)
    assert len(rows) >= 4 * len(steps) - 4  # rollouts of a step are written before its metrics
    assert all(e["type"] == "trainer" for e in run.events())
    assert run.system() is not None
    printed = (run_dir / "logs" / "telescope.stdout.log").read_text().split("\n")
    complete = printed[:-1]  # the text after the last newline may be a torn line
    assert complete == [f"printed after step {i}" for i in range(1, len(complete) + 1)]
    assert len(complete) >= len(steps) - 1  # each step's line is written right after its metrics


def test_torn_tail_is_skipped_and_writer_repairs_it(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    w = JsonlWriter(path)
    w.write({"a": 1})
    w.write({"a": 2, "nan": float("nan")})
    w.close()
    with open(path, "a") as f:
        f.write('{"a": 3, "trunc')  # a writer killed mid-line
    stats = JsonlReadStats()
    assert read_jsonl(path, stats) == [{"a": 1}, {"a": 2, "nan": None}]
    assert stats.torn_tail and stats.bad_lines == 0
    w = JsonlWriter(path)  # a resumed run appends after the torn fragment
    w.write({"a": 4})
    w.close()
    stats = JsonlReadStats()
    assert read_jsonl(path, stats) == [{"a": 1}, {"a": 2, "nan": None}, {"a": 4}]
    assert stats.bad_lines == 1 and not stats.torn_tail


def test_every_value_a_record_may_hold_is_written_as_strict_json(tmp_path: Path) -> None:
    """The writer's encoder (orjson) against the standard library's reading of each line: NaN/inf
    as null, int keys as strings, an int beyond 64 bits (orjson refuses it: the json fallback),
    arrays through ``tolist``, anything else as its ``str``, non-ASCII text as UTF-8."""

    class Array:  # what numpy and torch values offer
        def tolist(self) -> list[int]:
            return [1, 2]

    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    path = tmp_path / "x.jsonl"
    w = JsonlWriter(path)
    w.write({"f": [float("inf"), -float("inf"), 0.5], "keys": {3: "three"}, "t": (1, 2)})
    w.write({"big": 2**70, "nan": float("nan")})
    w.write({"array": Array(), "other": Opaque(), "text": "héllo ✓"})
    w.close()
    lines = path.read_bytes().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"f": [None, None, 0.5], "keys": {"3": "three"}, "t": [1, 2]},
        {"big": 2**70, "nan": None},
        {"array": [1, 2], "other": "opaque!", "text": "héllo ✓"},
    ]
    assert "héllo ✓".encode() in lines[2]  # UTF-8, not \\u escapes
    assert b"NaN" not in path.read_bytes() and b"Infinity" not in path.read_bytes()


def test_a_timeline_event_is_written_as_its_fields_by_either_encoder() -> None:
    """Events reach the encoder as dataclasses (no dict copy per event); the json fallback (an int
    beyond 64 bits) writes the same fields."""
    from telescope.core.observe import TimelineEvent
    from telescope.core.observe.rundir.jsonl import encode_line

    plain = TimelineEvent("generation", "end", step=3, group_id=7, sample_id=1, server=2, lane=5)
    assert json.loads(encode_line(plain)) == plain.to_dict()
    odd = TimelineEvent("run", name="x", attrs={"big": 2**70, "nan": float("nan")})
    assert json.loads(encode_line(odd)) == {**odd.to_dict(), "attrs": {"big": 2**70, "nan": None}}


def test_reader_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="run.json is missing"):
        RunDirReader(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(RunDirError, match="upgrade telescope-core"):
        RunDirReader(tmp_path)


def test_schema_1_directory_still_reads(tmp_path: Path) -> None:
    """Schema 1 kept rollouts and events in single files; the reader reads them before any blocks."""
    (tmp_path / "run.json").write_text(
        json.dumps({"schema_version": 1, "run_id": "old", "status": "finished"})
    )
    w = JsonlWriter(tmp_path / "rollouts.jsonl")
    w.write_many([{"step": 1, "group_id": 0, "kept": True}, {"step": 2, "group_id": 0, "kept": True}])
    w.close()
    w = JsonlWriter(tmp_path / "events.jsonl")
    w.write({"type": "run", "name": "old"})
    w.close()
    run = RunDirReader(tmp_path)
    assert [r["step"] for r in run.rollouts()] == [1, 2] and run.rollouts(step=2)[0]["step"] == 2
    assert [e["name"] for e in run.events()] == ["old"]
    assert run.latest_evals() == {} and run.events_tail() == []
