"""A trainer rank SIGKILLed after a checkpoint: the run restarts from it and finishes every step,
no prompt lost or trained twice (a real ``telescope train``: Ray, an FSDP rank, a transformers server)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml
from rundriver import actor_pids, finish, launch, read_jsonl, run_meta, settings, wait_for

from telescope.core.observe import RunDirReader

pytest.importorskip("ray")


@pytest.mark.slow
def test_a_killed_trainer_rank_restarts_from_the_checkpoint_and_finishes(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=8, checkpoint_every=2)))
    # Requests 1 s slower: steps take long enough that the kill lands mid-run on a fast machine
    # (at 0.1 s a step the run could be over before the kill).
    proc = launch(config, log, prelude="import os; os.environ['TELESCOPE_FAULTS'] = 'server_slow=1'")

    def past_checkpoint() -> bool:
        metrics = run_dir / "metrics.jsonl"
        return (
            (run_dir / "checkpoints" / "step_2").is_dir()
            and metrics.is_file()
            and len(read_jsonl(metrics)) >= 3
        )

    wait_for(past_checkpoint, proc, log, timeout_s=240)
    (victim,) = actor_pids(proc.pid, "TrainerWorker")
    os.kill(victim, signal.SIGKILL)
    assert finish(proc, log, 400) == 0, log.read_text()[-4000:]

    meta = run_meta(run_dir)
    assert meta["status"] == "finished" and meta["starts"] == 1
    (restart,) = meta["info"]["restarts"]
    assert restart["from_step"] in (2, 4, 6)  # the latest checkpoint when the rank died
    assert restart["reason"].startswith(f"TrainerDiedError: trainer rank 0 (pid {victim}) died")
    text = (run_dir / "logs" / "telescope.log").read_text()
    assert f"trainer rank 0 (pid {victim}) died" in text and "its last log lines" in text
    # The final history: steps up to the checkpoint from the first attempt, the rest after the restart.
    history: dict[int, set[int]] = {}
    for row in RunDirReader(run_dir).rollouts():
        step = int(row["step"])
        after = row["timings"].get("generation_start", 0) >= restart["time"]
        if row.get("discard_reason") is None and (step <= restart["from_step"]) != after:
            history.setdefault(step, set()).add(int(row["group_id"]))
    assert sorted(history) == list(range(1, 9))
    trained = [gid for groups in history.values() for gid in groups]
    assert len(trained) == len(set(trained)), "a prompt was trained at two steps"
    assert sorted(
        int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl") if r["time"] >= restart["time"]
    ) == list(range(restart["from_step"] + 1, 9))
