"""``telescope train`` with its output to a file (CI, nohup, a scheduler's log): plain lines only.

Real runs (Ray, an FSDP rank, a transformers server): one that trains 3 steps, one whose server
cannot start (``max_model_len`` beyond the tiny model's 4096 positions).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch, settings

pytest.importorskip("ray")


def train(tmp_path: Path, **fields: object) -> tuple[int, str]:
    """``telescope train`` on the test config with its output to a file: (exit code, that output)."""
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, **fields)))
    return finish(launch(config, log), log, 300), log.read_text()


@pytest.mark.slow
def test_output_to_a_file_is_plain_one_unwrapped_line_per_step(tmp_path: Path) -> None:
    rc, out = train(tmp_path, number_of_steps=3)
    assert rc == 0
    assert "\x1b" not in out and "\r" not in out, out  # no ANSI codes, no carriage-return redraws
    lines = out.splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(len(ln) > 80 and ln.count(" | ") == 7 for ln in steps)  # not wrapped at 80 columns
    assert any(ln.startswith("(TrainerWorker pid=") for ln in lines)  # Ray's worker lines, cleaned
    assert lines[-1].startswith("run finished after")
    assert (
        out.count("telescope train ") == 1
        and len([ln for ln in lines if ln.startswith("telescope train")]) == 1
    )


@pytest.mark.slow
def test_a_server_that_cannot_start_names_the_cause(tmp_path: Path) -> None:
    rc, out = train(tmp_path, max_model_len=8192)
    assert rc == 1
    failed = [ln for ln in out.splitlines() if ln.startswith("training failed: ")]
    cause = "ValueError: max_model_len: 8192 exceeds the 4096 positions of model"
    assert len(failed) == 1 and "exited with code 1 before it was ready: " + cause in failed[0]
    assert f"  | {cause}" in out  # the server log's tail follows
