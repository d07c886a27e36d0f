"""A frozen trainer rank (SIGSTOP) in the quickstart: the overdue step is diagnosed naming the rank,
``runs show`` says how long the step has run meanwhile, and the run restarts from its checkpoint and
finishes every step within 5 minutes of the freeze (a real ``telescope train``: Ray, two FSDP ranks,
a transformers server). Without a checkpoint the run ends with that diagnosis as its one line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from ports import free_port_block
from rundriver import actor_pids, finish, launch, pid_alive, read_jsonl, run_meta, settings, wait_for
from typer.testing import CliRunner

pytest.importorskip("ray")

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
STEPS = 20


def latest_checkpoint(run_dir: Path) -> int:
    steps = [int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
    return max(steps, default=0)


def steps_logged(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(read_jsonl(metrics)) if metrics.is_file() else 0


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_frozen_trainer_rank_is_diagnosed_and_the_run_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    from telescope.cli.app import app

    run_dir, log, config = tmp_path / "run", tmp_path / "cli.log", tmp_path / "run.yaml"
    cfg = yaml.safe_load(QUICKSTART.read_text())
    cfg.update(
        number_of_steps=STEPS,
        checkpoint_every=4,
        run_dir=str(run_dir),
        inference_base_port=free_port_block(1),
    )
    config.write_text(yaml.safe_dump(cfg))
    proc = launch(config, log)
    wait_for(lambda: steps_logged(run_dir) >= 6, proc, log, timeout_s=400)
    victim = actor_pids(proc.pid, "TrainerWorker")[-1]
    os.kill(victim, signal.SIGSTOP)
    frozen_at, done_at_freeze, checkpoint = time.time(), steps_logged(run_dir), latest_checkpoint(run_dir)
    try:
        # meanwhile the run directory says which step runs, for how long, against the median step
        time.sleep(20)
        shown = CliRunner().invoke(app, ["runs", "show", str(run_dir)], env={"COLUMNS": "250"}).output
        step = steps_logged(run_dir) + 1
        assert f"step {step} running for " in shown and "(median step " in shown, shown
        assert finish(proc, log, 300) == 0, log.read_text()[-4000:]
        killed = gone(victim)
    finally:
        if pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
    finished = time.time()

    meta = run_meta(run_dir)
    assert meta["status"] == "finished" and meta["starts"] == 1
    (restart,) = meta["info"]["restarts"]
    print(
        f"frozen after step {done_at_freeze}: diagnosed and restarting {restart['time'] - frozen_at:.0f}s "
        f"after the freeze, finished {finished - frozen_at:.0f}s after it"
    )
    assert finished - frozen_at < 300
    assert restart["from_step"] == checkpoint >= 4  # the latest checkpoint when the rank froze
    reason = restart["reason"]
    assert reason.startswith("TrainerHungError: step ") and " is overdue: running for " in reason
    assert f"(pid {victim}) has not answered a heartbeat for " in reason, reason
    assert killed  # no frozen process left behind
    text = (run_dir / "logs" / "telescope.log").read_text()
    assert "restarting the trainers and servers from checkpoint step" in text
    # every step, the ones after the checkpoint trained again after the restart
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted({int(r["step"]) for r in rows}) == list(range(1, STEPS + 1))
    after = sorted(int(r["step"]) for r in rows if r["time"] >= restart["time"])
    assert after == list(range(checkpoint + 1, STEPS + 1))


@pytest.mark.slow
def test_a_frozen_trainer_rank_without_a_checkpoint_ends_the_run_with_one_line(tmp_path: Path) -> None:
    run_dir, log, config = tmp_path / "run", tmp_path / "cli.log", tmp_path / "run.yaml"
    floor = 20.0  # the smallest run's steps take well under 2 s: the floor decides
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=40, trainer_overdue_floor_s=floor)))
    proc = launch(config, log)
    wait_for(lambda: steps_logged(run_dir) >= 3, proc, log, timeout_s=300)
    (victim,) = actor_pids(proc.pid, "TrainerWorker")
    os.kill(victim, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        assert finish(proc, log, 200) == 1, log.read_text()[-4000:]
        killed = gone(victim)  # no frozen process left behind
    finally:
        if pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
    took = time.time() - frozen_at
    assert killed
    print(f"frozen: the run ended {took:.0f}s after the freeze (trainer_overdue_floor_s {floor:g})")
    assert floor < took < floor + 60
    meta = run_meta(run_dir)
    assert meta["status"] == "failed" and "restarts" not in meta["info"]
    reason = meta["info"]["failure"]["reason"]
    assert reason.startswith("TrainerHungError: step ") and f"{floor:g}s) (trainer_overdue_factor" in reason
    assert f"trainer rank 0 (pid {victim}) has not answered a heartbeat for " in reason
    # the terminal says it once, last, before where the logs are
    lines = [
        line for line in log.read_text().splitlines() if "TrainerHungError" in line or "is overdue" in line
    ]
    assert lines == [f"training failed: {reason}"]
    assert log.read_text().rstrip().splitlines()[-2] == lines[0]
