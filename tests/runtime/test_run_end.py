"""A run always ends cleanly and says how in its run directory: failed (why), interrupted, finished.

Real ``telescope train`` processes (Ray, an FSDP rank, a transformers server). The failure is
injected at a driver-side boundary (loading the environments, after every process started).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml
from rundriver import enospc_prelude, finish, launch, read_jsonl, run_meta, session_pids, settings, wait_for

pytest.importorskip("ray")

FAIL_ENVIRONMENTS = (
    "import telescope.core.runtime.assemble as a\n"
    "def boom(cfg, registry):\n"
    "    raise RuntimeError('injected: the environment could not load its data')\n"
    "a.load_environments = boom"
)


def no_processes_left(sid: int, within_s: float = 15.0) -> list[int]:
    deadline = time.time() + within_s
    while (left := session_pids(sid)) and time.time() < deadline:
        time.sleep(0.3)
    return left


def test_a_failed_run_says_why_in_run_json_and_its_log(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir)))
    proc = launch(config, log, prelude=FAIL_ENVIRONMENTS)
    assert finish(proc, log, 240) == 1
    reason = "RuntimeError: injected: the environment could not load its data"
    console = log.read_text()
    assert f"training failed: {reason}" in console and "Traceback" not in console
    meta = run_meta(run_dir)
    assert meta["status"] == "failed" and meta["finished_at"] is not None
    failure = meta["info"]["failure"]
    assert failure["reason"] == reason and failure["type"] == "RuntimeError"
    assert failure["log_tail"] and failure["log_tail"][-1].endswith(f"training failed: {reason}")
    assert (
        f"ERROR telescope.runtime training failed: {reason}"
        in (run_dir / "logs" / "telescope.log").read_text()
    )
    assert "Traceback" in (run_dir / "logs" / "telescope.detailed.log").read_text()
    assert no_processes_left(proc.pid) == [], "Ray or a server outlived the failed run"


@pytest.mark.slow
def test_sigterm_interrupts_cleanly_and_the_run_resumes(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    fields = settings(run_dir, number_of_steps=6, checkpoint_every=2)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(fields))
    # Every request 1 s slower: steps 3-6 take seconds, so the signal lands before the run ends.
    proc = launch(config, log, prelude="import os; os.environ['TELESCOPE_FAULTS'] = 'server_slow=1'")
    wait_for(lambda: (run_dir / "checkpoints" / "step_2").is_dir(), proc, log, timeout_s=240)
    proc.send_signal(signal.SIGTERM)  # to the CLI process only, as `timeout` or a scheduler does
    assert finish(proc, log, 90) == 130
    assert run_meta(run_dir)["status"] == "interrupted"
    assert "received SIGTERM" in (run_dir / "logs" / "telescope.log").read_text()
    assert no_processes_left(proc.pid) == [], "Ray or a server outlived the interrupted run"
    done = {int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert 2 <= max(done) < 6, done

    config.write_text(yaml.safe_dump({**fields, "resume_from_checkpoint": True}))
    proc = launch(config, log)
    assert finish(proc, log, 300) == 0, log.read_text()[-3000:]
    meta = run_meta(run_dir)
    assert meta["status"] == "finished" and meta["starts"] == 2
    assert {int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl")} == set(range(1, 7))


def test_a_full_disk_at_a_checkpoint_stops_the_run_and_keeps_the_previous_one(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=4, checkpoint_every=2)))
    proc = launch(config, log, prelude=enospc_prelude("step_4.partial"))  # injected ENOSPC (see helper)
    assert finish(proc, log, 240) == 1, log.read_text()[-3000:]
    root = (run_dir / "checkpoints").resolve()
    reason = (
        f"StorageError: checkpoint at step 4 could not be written to {root / 'step_4'}: disk full (ENOSPC)"
    )
    assert f"training failed: {reason}" in log.read_text()
    meta = run_meta(run_dir)
    assert meta["status"] == "failed" and meta["info"]["failure"]["reason"].startswith(reason)
    assert f"the previous checkpoint {root / 'step_2'} is intact" in meta["info"]["failure"]["reason"]
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]  # no step_4, no partial folder
    assert (
        json.loads((root / "step_2" / "orchestrator_state.json").read_text())["counts"]["completed_steps"]
        == 2
    )
    assert no_processes_left(proc.pid) == []


@pytest.mark.slow
def test_a_full_disk_under_the_metrics_stops_the_run_naming_the_file(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=8)))
    proc = launch(config, log, prelude=enospc_prelude("metrics.jsonl", good_writes=2))
    assert finish(proc, log, 240) == 1, log.read_text()[-3000:]
    reason = f"StorageError: {(run_dir / 'metrics.jsonl').resolve()} could not be written: disk full (ENOSPC)"
    assert f"training failed: {reason}" in log.read_text()
    meta = run_meta(run_dir)
    assert meta["status"] == "failed" and meta["info"]["failure"]["reason"] == reason
    assert [int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    assert no_processes_left(proc.pid) == []
