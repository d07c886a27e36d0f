"""The dashboard's data API on run directories the tests write: finished, live (appended to),
crashed (torn lines), resumed (steps logged again) and schema 1."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from ui_runs import GROUP_REWARDS, append_frame, append_jsonl, log_step, start_hub, step_rows, write_run

from telescope.cli.ui.data import RunData, Workspace, declared_ranges
from telescope.cli.ui.index import StepIndex, bisect_step_spans
from telescope.cli.ui.rollouts import RolloutFilter
from telescope.core.observe.rundir.reader import RunDirError


def _gini(xs: list[float]) -> float:
    """The doc's formula, pairwise: sum_ij |xi - xj| / (2 n^2 mean)."""
    n, mean = len(xs), sum(xs) / len(xs)
    return sum(abs(a - b) for a in xs for b in xs) / (2 * n * n * mean) if mean else 0.0


def test_metrics_catalog_sections_and_declared_ranges(finished_run: Path) -> None:
    run = RunData(finished_run, "run")
    catalog = {k["key"]: k for k in run.catalog()["keys"]}
    assert (catalog["entropy"]["section"], catalog["entropy"]["group"]) == ("General", "")
    assert (catalog["reward/mean"]["section"], catalog["reward/mean"]["group"]) == ("reward", "")
    assert (catalog["debug/grads/layer_norm"]["section"], catalog["debug/grads/layer_norm"]["group"]) == (
        "debug",
        "grads",
    )
    assert catalog["reward/mean"]["range"] == [0.0, 1.0]
    assert catalog["sample_metrics/correct/max"]["range"] == [0.0, 1.0]
    assert catalog["reward/std"]["range"] is None and catalog["entropy"]["range"] is None
    series = run.metric_series(["entropy", "reward/mean", "missing"])
    assert series["step"] == [1, 2, 3, 4]
    assert series["values"]["entropy"] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    kept = [[r if r is not None else s / 10 for g in GROUP_REWARDS.values() for r in g] for s in range(1, 5)]
    assert series["values"]["reward/mean"] == pytest.approx([sum(k) / len(k) for k in kept])
    assert series["values"]["missing"] == [None] * 4
    summary = run.summary()
    assert (summary["status"], summary["step"], summary["steps_logged"]) == ("finished", 4, 4)
    assert summary["reward"] == pytest.approx(sum(kept[-1]) / 8)
    assert summary["highlights"]["number_of_steps"] == 4
    evals = run.eval_records()["records"]
    assert [(e["name"], e["step"], e["metrics"]["pass@1"]) for e in evals] == [
        ("math", 2, 0.2),
        ("math", 4, 0.4),
    ]
    assert [r["prompt"] for r in run.eval_samples("math", 4)] == ["q0", "q1", "q2"]


def test_declared_ranges_union_and_per_env() -> None:
    info = {
        "environments": [
            {"name": "a", "reward_min": 0, "reward_max": 2, "metrics_ranges": {"m": {"min": 0, "max": 5}}},
            {"name": "b", "reward_min": -1, "reward_max": 1},
        ]
    }
    keys = [
        "reward/mean",
        "reward/a/max",
        "reward/b/min",
        "reward/std",
        "sample_metrics/m/mean",
        "sample_metrics/m/std",
    ]
    assert declared_ranges(info, keys) == {
        "reward/mean": [-1, 2],
        "reward/a/max": [0, 2],
        "reward/b/min": [-1, 1],
        "sample_metrics/m/mean": [0, 5],
    }
    # one environment without a declared range: the observed range is used for the overall reward
    info["environments"][1]["reward_max"] = None
    assert "reward/mean" not in declared_ranges(info, keys)


def test_rollout_filters_and_step_summary(finished_run: Path) -> None:
    run = RunData(finished_run, "run")
    rows = [r.to_dict() for r in step_rows(3)]
    everything = run.rollout_query(3, RolloutFilter())
    assert (everything["total"], everything["matched"]) == (len(rows), len(rows))
    flt = RolloutFilter(reward_min=0.2, reward_max=0.9)
    expected = [(r["group_id"], r["sample_id"]) for r in rows if 0.2 <= r["reward"] <= 0.9]
    got = run.rollout_query(3, flt)
    assert [(r["group_id"], r["sample_id"]) for r in got["rows"]] == expected
    assert run.rollout_query(3, RolloutFilter(outcome="discarded"))["matched"] == 2
    assert run.rollout_query(3, RolloutFilter(outcome="cancelled"))["matched"] == 1
    assert (
        run.rollout_query(3, RolloutFilter(outcome="kept", length_min=6))["matched"] == 4
    )  # samples 2, 3 of 2 groups
    assert run.rollout_query(3, RolloutFilter(advantage_max=-0.01, outcome="kept"))["matched"] == sum(
        1 for r in rows if r["discard_reason"] is None and r["advantage"] <= -0.01
    )
    assert run.rollout_query(3, RolloutFilter(text="DROW1-2"))["matched"] == 1
    summary = everything["summary"]
    assert summary["outcomes"] == {"kept": 8, "max_async": 2, "off_policy": 1}
    groups = [[r if r is not None else 0.3 for r in g] for g in GROUP_REWARDS.values()]
    assert summary["reward"]["gini_mean"] == pytest.approx(sum(_gini(g) for g in groups) / 2)
    assert summary["reward"]["max"] == 1.0 and summary["reward"]["min"] == 0.0
    correct = [[float(r > 0.4) for r in g] for g in groups]
    assert summary["sample_metrics"]["correct"]["mean"] == pytest.approx(sum(map(sum, correct)) / 8)
    assert summary["sample_metrics"]["correct"]["gini_mean"] == pytest.approx(
        sum(_gini(g) for g in correct) / 2
    )
    one = run.sample(3, 1, 2)
    assert one is not None and one["completion_ids"] == [0, 1, 2, 3, 4, 5] and one["reward"] == 0.25
    assert [r["sample_id"] for r in run.group(3, 0)] == [0, 1, 2, 3]


def test_live_run_is_followed_as_it_is_appended(tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "live")
    log_step(hub, 1)
    run = RunData(tmp_path / "live", "live", refresh_s=0.0)
    assert run.metric_series(["entropy"])["step"] == [1] and run.summary()["status"] == "running"
    revision = run.metrics.revision
    log_step(hub, 2)
    assert run.metric_series(["entropy"])["step"] == [1, 2] and run.metrics.revision > revision
    assert run.rollout_query(2, RolloutFilter())["total"] == len(step_rows(2))
    # a line being written (no newline yet) is not read until it is complete
    metrics_file = tmp_path / "live" / "metrics.jsonl"
    line = json.dumps({"step": 3, "time": 1.0, "metrics": {"entropy": 0.1}})
    append_jsonl(metrics_file, torn=line[:20])
    assert run.metric_series(["entropy"])["step"] == [1, 2] and run.metrics.torn_tail
    append_jsonl(metrics_file, torn=line[20:] + "\n")
    assert run.metric_series(["entropy"])["values"]["entropy"][-1] == 0.1 and not run.metrics.torn_tail
    hub.finish("finished")
    assert run.summary()["status"] == "finished"


def test_compressed_blocks_are_followed_live_and_a_skipped_frame_is_reported(tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "live")
    log_step(hub, 1)
    hub.tick()  # the hub's tick appends the buffered events
    run = RunData(tmp_path / "live", "live", refresh_s=0.0)
    kinds = sorted({(s["type"], s["step"]) for s in run.timeline(1, 1)["spans"]})
    assert kinds == [("generation", 1), ("reward", 1), ("trainer", 1), ("trainer_phase", 1)]
    assert run.rollout_query(1, RolloutFilter())["total"] == len(step_rows(1))
    log_step(hub, 2)
    hub.tick()
    assert {s["step"] for s in run.timeline(2, 2)["spans"]} == {2}
    assert run.sample(2, 1, 3)["reward"] == pytest.approx(0.2)  # type: ignore[index]
    # a writer died mid-frame (step 3), the run resumed and logged step 3 again after the torn bytes
    block = tmp_path / "live" / "rollouts" / "block_000000.jsonl.zst"
    append_frame(block, *[{**r.to_dict(), "reward": 0.75} for r in step_rows(3)], cut=50)
    assert run.rollout_query(3, RolloutFilter())["total"] == 0 and run.summary()["read"] == {}
    log_step(hub, 3)
    assert run.rollout_query(3, RolloutFilter())["total"] == len(step_rows(3))
    assert run.summary()["read"] == {"rollouts/block_000000.jsonl.zst": {"bad_lines": 0, "skipped_frames": 1}}
    hub.finish("finished")


def test_crashed_run_skips_torn_and_bad_lines(tmp_path: Path) -> None:
    write_run(tmp_path / "crashed", steps=2, finish=False)
    root = tmp_path / "crashed"
    append_jsonl(root / "metrics.jsonl", torn='{"step": 3, "metr')
    block = root / "rollouts" / "block_000000.jsonl.zst"
    append_frame(block, raw=b"not json\n")  # a malformed line in a sound frame
    append_frame(block, *[r.to_dict() for r in step_rows(3)], cut=40)  # the writer died mid-frame
    run = RunData(root, "crashed")
    assert run.metric_series(["entropy"])["step"] == [1, 2]
    assert run.summary()["read"]["metrics.jsonl"] == {"torn_tail": True, "bad_lines": 0}
    assert run.summary()["status"] == "running" and not run.summary()["stale"]
    # files written an hour ago say nothing: the run recorded its step in progress (run.json)
    old = time.time() - 3600
    for path in root.rglob("*"):
        os.utime(path, (old, old))
    assert not run.summary()["stale"]
    meta = json.loads((root / "run.json").read_text())
    meta["progress"].update(step_started_at=old, recent_step_seconds=[1.0, 1.0])  # step 3 running for an hour
    (root / "run.json").write_text(json.dumps(meta))
    os.utime(root / "run.json", (old, old))
    run.refresh(force=True)
    assert run.summary()["stale"] and run.summary()["health"]["state"] == "overdue"
    # a run.json of an older version (no progress): judged by its files' last writes
    del meta["progress"]
    (root / "run.json").write_text(json.dumps(meta))
    run.refresh(force=True)
    assert not run.summary()["stale"]
    os.utime(root / "run.json", (old + 1, old + 1))
    run.refresh(force=True)
    assert run.summary()["stale"] and run.summary()["health"]["state"] == "unknown"
    assert run.rollout_query(2, RolloutFilter())["total"] == len(step_rows(2))
    assert run.rollout_query(3, RolloutFilter())["total"] == 0
    index = StepIndex(block)
    index.refresh()
    assert index.bad_lines == 1 and index.torn_tail and index.step_numbers() == [1, 2]


def test_resumed_run_later_records_win(tmp_path: Path) -> None:
    write_run(tmp_path / "resumed", steps=4, finish=False)
    root = tmp_path / "resumed"
    # the run died after step 4; it resumes from a step-2 checkpoint and logs step 3 again
    meta = json.loads((root / "run.json").read_text())
    (root / "run.json").write_text(json.dumps({**meta, "starts": 2}))
    append_jsonl(root / "metrics.jsonl", {"step": 3, "time": 9.0, "metrics": {"entropy": 42.0}})
    rows = [{**r.to_dict(), "reward": 0.125} for r in step_rows(3)[:3]]
    append_frame(root / "rollouts" / "block_000000.jsonl.zst", *rows)
    run = RunData(root, "resumed")
    series = run.metric_series(["entropy"])
    assert series["step"] == [1, 2, 3] and series["values"]["entropy"] == [1.0, 0.5, 42.0]
    assert run.metrics.superseded == 2
    got = run.rollout_query(3, RolloutFilter())
    assert got["total"] == 3 and {r["reward"] for r in got["rows"]} == {0.125}
    assert run.rollout_query(2, RolloutFilter())["total"] == len(step_rows(2))  # untouched
    append_jsonl(root / "metrics.jsonl", {"step": 4, "time": 10.0, "metrics": {"entropy": 43.0}})
    assert run.metric_series(["entropy"])["values"]["entropy"] == [1.0, 0.5, 42.0]  # refresh is throttled
    run.refresh(force=True)
    assert run.metric_series(["entropy"])["values"]["entropy"] == [1.0, 0.5, 42.0, 43.0]


def _v1_run(root: Path) -> None:
    root.mkdir()
    (root / "run.json").write_text(
        json.dumps({"schema_version": 1, "run_id": "old", "name": "old", "status": "finished"})
    )
    append_jsonl(
        root / "metrics.jsonl",
        *({"step": s, "time": float(s), "metrics": {"entropy": s / 10}} for s in (1, 2)),
    )
    append_jsonl(root / "rollouts.jsonl", *(r.to_dict() for s in (1, 2) for r in step_rows(s)))
    events = [
        {
            "type": "generation",
            "phase": "start",
            "step": 1,
            "group_id": 0,
            "sample_id": 0,
            "server": 1,
            "lane": 2,
            "time": 10.0,
        },
        {
            "type": "generation",
            "phase": "end",
            "step": 2,
            "group_id": 0,
            "sample_id": 0,
            "server": 1,
            "lane": 2,
            "time": 12.0,
        },
        {"type": "reward", "phase": "start", "step": 2, "group_id": 0, "sample_id": 0, "time": 12.0},
        {"type": "reward", "phase": "end", "step": 2, "group_id": 0, "sample_id": 0, "time": 12.5},
        {"type": "trainer", "phase": "start", "name": "train_step", "step": 2, "time": 13.0},
        {"type": "trainer", "phase": "end", "name": "train_step", "step": 2, "time": 15.0},
        {"type": "checkpoint", "phase": "instant", "step": 2, "time": 15.5, "attrs": {"path": "x"}},
        {"type": "run", "phase": "instant", "name": "resumed", "step": None, "time": 14.0},
        {"type": "run", "phase": "instant", "name": "outside the window", "step": None, "time": 99.0},
    ]
    append_jsonl(root / "events.jsonl", *events)
    append_jsonl(root / "metrics.jsonl", {"step": 3, "time": 3.0, "metrics": {"timing_forward_total": 0.5}})


def test_schema_1_single_files_and_timeline(tmp_path: Path) -> None:
    _v1_run(tmp_path / "old")
    run = RunData(tmp_path / "old", "old")
    assert run.metric_series(["entropy"])["values"]["entropy"] == [0.1, 0.2, None]
    assert run.rollout_query(2, RolloutFilter())["total"] == len(step_rows(2))
    tl = run.timeline(2, 2)
    by_type = {s["type"]: s for s in tl["spans"]}
    # the generation started while step 1 was filling and ended in step 2: still one span
    assert (by_type["generation"]["start"], by_type["generation"]["end"]) == (10.0, 12.0)
    assert by_type["generation"]["row"] == "server 1 / lane 2" == by_type["reward"]["row"]
    assert (by_type["trainer"]["start"], by_type["trainer"]["end"]) == (13.0, 15.0)
    assert [(i["type"], i["name"], i["row"]) for i in tl["instants"]] == [
        ("checkpoint", None, "checkpoints"),
        ("run", "resumed", "run"),
    ]


def test_timeline_derives_trainer_phases_from_timing_metrics(finished_run: Path) -> None:
    tl = RunData(finished_run, "run").timeline(2, 3)
    steps = [s for s in tl["spans"] if s["type"] == "trainer"]
    assert [s["step"] for s in steps] == [2, 3]
    phases = [s for s in tl["spans"] if s["type"] == "trainer_phase" and s["step"] == 2]
    assert [p["name"] for p in phases] == ["forward", "backward"]
    # 0.5 s + 0.25 s of timings do not fit in the (near-instant) train_step span: scaled to fit it
    span = steps[0]["end"] - steps[0]["start"]
    assert [p["attrs"]["seconds"] for p in phases] == [0.5, 0.25]
    assert phases[0]["attrs"]["scale"] == pytest.approx(span / 0.75)
    assert phases[0]["start"] == steps[0]["start"]
    assert phases[0]["end"] - phases[0]["start"] == pytest.approx(
        span * 2 / 3, abs=1e-6
    )  # unix times: ~1e-7 s steps
    assert phases[1]["start"] == pytest.approx(phases[0]["end"]) and all(p["derived"] for p in phases)
    assert phases[1]["end"] <= steps[0]["end"]
    assert [(i["type"], i["name"], i["step"], i["row"]) for i in tl["instants"]] == [
        ("eval", "math", 2, "evals")
    ]
    with pytest.raises(ValueError, match="too wide"):
        RunData(finished_run, "run").timeline(0, 500)


def test_logs_filter_by_component_level_text_and_follow(finished_run: Path) -> None:
    logs = finished_run / "logs"
    (logs / "inference").mkdir(parents=True, exist_ok=True)
    # the logger wrote its own start-up/step lines to the detailed log; this test sets every file it reads
    (logs / "telescope.detailed.log").unlink(missing_ok=True)
    (logs / "telescope.log").write_text(
        "2026-01-01 10:00:00,001 INFO telescope.runtime starting\n"
        "2026-01-01 10:00:01,000 ERROR telescope.runtime boom\nTraceback (most recent call last):\n  ValueError: x\n"
    )
    (logs / "telescope.stdout.log").write_text(
        "\x1b[36m(TrainerWorker pid=12)\x1b[0m 2026-01-01 10:00:00,500 WARNING fsdp slow step\n"
    )
    (logs / "inference" / "server_0.log").write_text(
        "2026-01-01 10:00:00,700 telescope.inference INFO serving\n"
    )
    store = RunData(finished_run, "run").logs
    got = store.query()
    assert [(e["component"], e["level"]) for e in got["entries"]] == [
        ("driver", "INFO"),
        ("TrainerWorker pid 12", "WARNING"),
        ("server 0", "INFO"),
        ("driver", "ERROR"),
        ("driver", "ERROR"),
        ("driver", "ERROR"),
    ]
    assert [e["text"] for e in store.query(level="ERROR")["entries"]][1:] == [
        "Traceback (most recent call last):",
        "  ValueError: x",
    ]
    assert [e["component"] for e in store.query(components=["server 0"])["entries"]] == ["server 0"]
    assert [e["text"][-9:] for e in store.query(text="SLOW")["entries"]] == ["slow step"]
    seq = got["seq"]
    with open(logs / "telescope.log", "a") as f:
        f.write("2026-01-01 10:00:02,000 INFO telescope.runtime step 1\n")
    assert [e["text"][-6:] for e in store.query(after=seq)["entries"]] == ["step 1"]


def test_workspace_finds_runs_under_a_parent(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", steps=1)
    write_run(tmp_path / "runs" / "nested" / "a", steps=1)
    (tmp_path / "runs" / "notes").mkdir()
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "run.json").write_text(json.dumps({"schema_version": 99}))
    ws = Workspace([tmp_path / "runs"])
    assert sorted(r.key for r in ws.runs()) == ["a", "nested-a"]
    assert "upgrade telescope-core" in ws.errors[str(tmp_path / "runs" / "broken")]
    write_run(tmp_path / "runs" / "b", steps=1)
    ws.scan(force=True)
    assert sorted(r.key for r in ws.runs()) == ["a", "b", "nested-a"]
    with pytest.raises(KeyError, match="known runs are a, b, nested-a"):
        ws.get("zzz")
    with pytest.raises(RunDirError, match="no such folder"):
        Workspace([tmp_path / "nope"])


def test_step_index_reads_only_the_asked_step(tmp_path: Path) -> None:
    path = tmp_path / "block.jsonl"
    append_jsonl(path, *({"step": s, "pad": "x" * 1000, "i": i} for s in (1, 2, 3) for i in range(5)))
    index = StepIndex(path)
    assert index.refresh() == 15 and index.step_numbers() == [1, 2, 3]
    spans = index.spans(2, 2)
    assert len(spans) == 5 and sum(length for _, length in spans) < path.stat().st_size / 2
    with open(path, "rb") as f:
        f.seek(spans[0][0])
        assert json.loads(f.read(spans[0][1]))["step"] == 2
    # other key order: the step is still found
    append_jsonl(path, {"i": 9, "pad": "y", "step": 4})
    assert index.refresh() == 1 and index.count(4) == 1


@pytest.mark.parametrize("seed", range(6))
def test_binary_search_finds_the_same_lines_as_the_index(tmp_path: Path, seed: int) -> None:
    """Second implementation: on a block whose steps never go down, the binary search over byte
    offsets returns exactly the full index's lines for every step (gaps, long lines, a torn tail)."""
    import random

    rng = random.Random(seed)
    path = tmp_path / "block.jsonl"
    steps = sorted(rng.choice([0, 1, 2, 2, 5, 6, 9]) for _ in range(rng.randint(0, 60)))
    append_jsonl(
        path,
        *({"step": s, "pad": "x" * rng.randint(0, 9000)} for s in steps),
        torn='{"step": 9, "pa' * (seed % 2),
    )
    index = StepIndex(path)
    index.refresh()
    for step in range(-1, 11):
        assert bisect_step_spans(path, step) == index.spans(step, step), step


def test_timeline_reads_only_the_event_blocks_near_its_steps(tmp_path: Path) -> None:
    root = tmp_path / "long"
    root.mkdir()
    meta = {
        "schema_version": 2,
        "status": "finished",
        "created_at": 1000.0,
        "layout": {"rollout_block_size": 500, "event_block_duration_seconds": 10.0},
    }
    (root / "run.json").write_text(json.dumps(meta))
    for s in range(1, 10):  # step s runs in [1000 + 10 s, 1000 + 10 s + 9]: its events are in block s
        t = 1000.0 + 10 * s
        ids = {"type": "generation", "group_id": s, "sample_id": 0, "server": 0, "lane": 0}
        append_jsonl(
            root / "events" / f"block_{s:06d}.jsonl",
            {**ids, "phase": "start", "step": s, "time": t + 1},
            {**ids, "phase": "end", "step": s, "time": t + 5},
        )
        append_jsonl(root / "metrics.jsonl", {"step": s, "time": t + 9, "metrics": {"entropy": 1.0}})
    # a generation of step 8 that started during step 7 (async): in block 7, still found
    ids = {"type": "generation", "group_id": 80, "sample_id": 0, "server": 0, "lane": 1}
    append_jsonl(root / "events" / "block_000007.jsonl", {**ids, "phase": "start", "step": 8, "time": 1075.0})
    append_jsonl(root / "events" / "block_000008.jsonl", {**ids, "phase": "end", "step": 8, "time": 1084.0})
    run = RunData(root, "long")
    tl = run.timeline(8, 8)
    assert sorted((s["group_id"], s["start"], s["end"]) for s in tl["spans"]) == [
        (8, 1081.0, 1085.0),
        (80, 1075.0, 1084.0),
    ]
    indexed = sorted(p.name for p in run.events._indexes)
    assert indexed == [f"block_{k:06d}.jsonl" for k in range(4, 10)]  # from the end of step 4 on
    assert len(run.timeline(1, 9)["spans"]) == 10


def test_newer_record_fields_tags_reasons_and_failure(tmp_path: Path) -> None:
    """Fields a newer runtime writes (sample_tags, other discard reasons, info.failure) are read
    as data: filters and summaries take them without knowing them in advance."""
    write_run(tmp_path / "new", steps=1, finish=False)
    root = tmp_path / "new"
    rows = [
        {**r.to_dict(), "sample_tags": {"difficulty": "hard" if r.sample_id % 2 else "easy"}}
        for r in step_rows(2)
    ]
    rows[0] = {**rows[0], "discard_reason": "reward_error"}
    append_jsonl(root / "rollouts" / "block_000000.jsonl", *rows)
    meta = json.loads((root / "run.json").read_text())
    meta["status"], meta["info"]["failure"] = (
        "failed",
        {"reason": "reward server unreachable", "type": "OSError"},
    )
    (root / "run.json").write_text(json.dumps(meta))
    run = RunData(root, "new")
    hard = run.rollout_query(2, RolloutFilter(tag="difficulty=hard"))
    assert hard["matched"] == sum(1 for r in rows if r["sample_id"] % 2) and {
        "difficulty=easy",
        "difficulty=hard",
    } == set(hard["options"]["tags"])
    assert hard["summary"]["tags"] == ["difficulty=hard"]  # the summary is over the filtered rows
    discarded = run.rollout_query(2, RolloutFilter(outcome="discarded"))
    assert discarded["matched"] == 3 and discarded["summary"]["outcomes"]["reward_error"] == 1
    assert run.rollout_query(2, RolloutFilter(outcome="reward_error"))["rows"][0]["sample_tags"] == {
        "difficulty": "easy"
    }
    assert run.summary()["failure"] == "reward server unreachable"


def test_runs_page_names_a_built_in_model_as_the_user_wrote_it(finished_run: Path) -> None:
    import yaml

    meta = json.loads((finished_run / "run.json").read_text())
    assert RunData(finished_run, "run").summary()["highlights"]["model"] == meta["info"]["model"]
    del meta["info"]["model"]  # a run written before run.json named the model
    (finished_run / "run.json").write_text(json.dumps(meta))
    cfg_path = finished_run / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    # config.yaml holds the resolved folder of a built-in model
    cfg_path.write_text(
        yaml.safe_dump({**cfg, "model": "/root/.cache/telescope/models/telescope--tiny-reverse"})
    )
    assert RunData(finished_run, "run").summary()["highlights"]["model"] == "telescope/tiny-reverse"
    cfg_path.write_text(yaml.safe_dump({**cfg, "model": "/data/my-model"}))
    assert RunData(finished_run, "run").summary()["highlights"]["model"] == "/data/my-model"


@pytest.mark.timeout(60)  # generous: linear takes well under a second; re-scanning the line took minutes
def test_a_multi_megabyte_line_is_read_in_one_linear_pass(tmp_path: Path) -> None:
    from telescope.core.observe.rundir.tail import FileTail

    path = tmp_path / "telescope.stdout.log"
    long_line = b"x" * (32 * 1024 * 1024)  # a progress bar that never printed '\n', then a line end
    path.write_bytes(b"first\n" + long_line + b"\nlast\n" + b"torn")
    tail = FileTail(path)
    lines, reset = tail.read_lines(limit=1024)  # 1 KiB reads: 32,768 of them for the long line
    assert not reset and [(ln.offset, len(ln.data)) for ln in lines] == [(0, 5)]  # stops at the chunk's line
    lines, _ = tail.read_lines(limit=1024)  # to the end of the long line's chunk: "last" is in it
    assert [(ln.offset, ln.data == long_line) for ln in lines] == [(6, True), (6 + len(long_line) + 1, False)]
    assert lines[1].data == b"last" and tail.torn_tail
    assert tail.read_lines(limit=1024) == ([], False)
    assert tail.offset == path.stat().st_size - len(b"torn")


def _columns(records: list[dict], label: str) -> dict[str, list]:
    """The Infra series of one source, built the plain way: a column per metric any of its samples
    has as a number, that sample's value or None."""
    mine = [r for r in records if label == ("torch rank 0" if r.get("source") == "torch" else "system n1")]
    keys = {k for r in mine for k, v in r["metrics"].items() if isinstance(v, float)}
    return {
        k: [r["metrics"].get(k) if isinstance(r["metrics"].get(k), float) else None for r in mine]
        for k in keys
    }


def test_system_series_aligns_metrics_per_source_and_is_computed_once_per_change(finished_run: Path) -> None:
    # metrics that appear late, stop, or are not numbers; two sources interleaved
    records = [
        {
            "time": float(i),
            "node": "n1",
            "source": "system",
            "metrics": {"cpu": i / 10, **({"gpu": i / 5} if 3 <= i < 7 else {}), "flag": i % 2 == 0},
        }
        for i in range(10)
    ] + [
        {"time": i + 0.5, "source": "torch", "rank": 0, "metrics": {"rss_gb": i / 4, "note": "x"}}
        for i in range(5)
    ]
    append_jsonl(finished_run / "system.jsonl", *records)
    run = RunData(finished_run, "run")
    series = run.system_series()["series"]
    assert sorted(series) == ["system n1", "torch rank 0"]
    assert series["system n1"]["time"] == [float(i) for i in range(10)]
    assert series["system n1"]["values"] == _columns(records, "system n1")
    assert series["system n1"]["values"]["gpu"] == [None] * 3 + [0.6, 0.8, 1.0, 1.2] + [None] * 3
    assert (
        series["torch rank 0"]["values"]
        == _columns(records, "torch rank 0")
        == {"rss_gb": [0, 0.25, 0.5, 0.75, 1.0]}
    )
    # thinned to about max_points: every (10 // 4)-th sample
    assert run.system_series(max_points=4)["series"]["system n1"]["time"] == [0.0, 2.0, 4.0, 6.0, 8.0]
    # asked again with nothing appended: the same result, not computed again; then new samples
    assert run.system_series()["series"] is run.system_series()["series"]
    append_jsonl(
        finished_run / "system.jsonl",
        {"time": 10.0, "source": "system", "node": "n1", "metrics": {"cpu": 1.0}},
    )
    run.refresh(force=True)
    after = run.system_series()["series"]["system n1"]
    assert after["time"][-1] == 10.0 and after["values"]["cpu"][-1] == 1.0  # the new sample is in
    assert len(after["values"]["gpu"]) == 11 and after["values"]["gpu"][-1] is None
