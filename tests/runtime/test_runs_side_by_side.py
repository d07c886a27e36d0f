"""Two quick starts at once on one machine: neither joins the other's Ray cluster, takes its ports
or its placement-group names, and both finish."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from rundriver import finish, launch, run_meta, training_pid, wait_for

pytest.importorskip("ray")

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
SHORT = ["--number_of_steps", "2", "--prompts_batch_size_for_trainer", "4", "--group_size", "4"]


@pytest.mark.slow
def test_two_quickstarts_at_once_both_finish(tmp_path: Path) -> None:
    dirs, logs = [tmp_path / "a", tmp_path / "b"], [tmp_path / "a.log", tmp_path / "b.log"]
    # Both keep the defaults that collided: ray_address auto and inference_base_port 8100.
    first = launch(QUICKSTART, logs[0], "--run_dir", str(dirs[0]), *SHORT)
    procs = [first]
    try:
        wait_for(
            lambda: "started a private local Ray cluster" in _log(dirs[0]), first, logs[0], timeout_s=180
        )
        first_pid = training_pid(first.pid)
        second = launch(QUICKSTART, logs[1], "--run_dir", str(dirs[1]), *SHORT)
        procs.append(second)
        assert finish(second, logs[1], 420) == 0, logs[1].read_text()[-3000:]
        assert finish(first, logs[0], 420) == 0, logs[0].read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    for run_dir in dirs:
        assert run_meta(run_dir)["status"] == "finished"
    second_log = _log(dirs[1])
    # the second run started its own cluster (when `auto` found the first one's, it says so)
    assert "started a private local Ray cluster" in second_log
    assert "joined the running Ray cluster" not in second_log
    # `auto` saw the first run's cluster and named it
    assert f"the private cluster of the Telescope run with pid {first_pid} (run_dir {dirs[0]})" in second_log
    # the first run holds 8100 (or the first free block): the second moved to another block
    moved = re.search(r"inference ports 8100-8100 are in use .* listen on (\d+)-\d+ instead", second_log)
    assert moved is not None and int(moved.group(1)) > 8100, second_log[-2000:]


def _log(run_dir: Path) -> str:
    path = run_dir / "logs" / "telescope.log"
    time.sleep(0)  # read fresh each call
    return path.read_text() if path.is_file() else ""
