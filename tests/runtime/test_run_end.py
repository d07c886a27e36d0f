"""A run always ends cleanly and says how in its run directory: failed (why), interrupted, finished.

Real ``telescope train`` processes (Ray, an FSDP rank, a transformers server). The failure is
injected at a driver-side boundary (loading the environments, after every process started).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch, read_jsonl, run_meta, session_pids, settings, wait_for

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
    proc = launch(config, log)
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
