"""One run per run directory: a live run's lock refuses a second one; an old run is never appended to."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch, run_meta, session_pids, settings, training_pid, wait_for

from telescope.core.config import ConfigError, load_config
from telescope.core.plugins import load_plugins
from telescope.core.runtime.rundir import LOCK_FILE, RunDirLock, check_run_dir_free

HOLD_LOCK = (
    "import sys, time\nfrom telescope.core.runtime.rundir import RunDirLock\n"
    "lock = RunDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(120)"
)


def cli_train(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from telescope.cli.app import main; sys.argv[0] = 'telescope'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "train", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_second_run_on_a_locked_run_dir_is_refused_naming_the_first(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(settings(run_dir)))
        out = cli_train(config)
        assert out.returncode == 2, out.stderr
        assert f"run_dir {run_dir.resolve()} is in use by the live run with pid {holder.pid}" in out.stderr
        assert "Traceback" not in out.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # the refused run wrote nothing
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: the kernel dropped its lock, the next run takes over.
    with caplog.at_level(logging.INFO, logger="telescope.runtime"), RunDirLock(run_dir) as lock:
        assert json.loads(lock.path.read_text())["pid"] != holder.pid
        with pytest.raises(ConfigError, match="in use by the live run with pid"):
            RunDirLock(run_dir).acquire()  # a second lock in this very process is refused too
    assert f"taking over the lock of pid {holder.pid}, which is no longer running" in caplog.text
    RunDirLock(run_dir).acquire().release()  # released: free again


@pytest.mark.slow
def test_a_live_run_holds_its_run_dir_against_a_second_run_even_with_overwrite(tmp_path: Path) -> None:
    """A real ``telescope train`` whose requests never answer (it cannot finish while the second run
    tries), then SIGTERM: it still ends cleanly as ``interrupted``."""
    pytest.importorskip("ray")
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=3, stall_timeout_s=0)))
    proc = launch(config, log, prelude="import os; os.environ['TELESCOPE_FAULTS'] = 'server_slow=3600'")
    try:
        log_file = run_dir / "logs" / "telescope.log"
        wait_for(
            lambda: log_file.is_file() and "started a private local Ray cluster" in log_file.read_text(),
            proc,
            log,
            timeout_s=240,
        )
        before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
        out = cli_train(config, "--overwrite")  # --overwrite would delete a finished run: never a live one
        assert out.returncode == 2, out.stderr[-3000:]
        holder = training_pid(proc.pid)
        assert f"run_dir {run_dir.resolve()} is in use by the live run with pid {holder}" in out.stderr
        assert "Traceback" not in out.stderr
        assert set(before) <= set(p.relative_to(run_dir) for p in run_dir.rglob("*"))  # nothing deleted
        assert proc.poll() is None and run_meta(run_dir)["status"] == "running"
        proc.send_signal(signal.SIGTERM)
        assert finish(proc, log, 120) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert run_meta(run_dir)["status"] == "interrupted"
    deadline = time.time() + 15
    while session_pids(proc.pid) and time.time() < deadline:
        time.sleep(0.3)
    assert session_pids(proc.pid) == [], "Ray or a server outlived the interrupted run"


def previous_run(run_dir: Path) -> None:
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_2" / "meta.json").write_text("{}")
    (run_dir / "run.json").write_text(json.dumps({"status": "finished", "run_id": "old"}))
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')


def test_a_non_empty_run_dir_without_resume_is_refused_with_the_fixes(tmp_path: Path) -> None:
    from telescope.core.runtime import run_training

    run_dir = tmp_path / "run"
    previous_run(run_dir)
    pset, registry = load_plugins()
    cfg = load_config(None, settings(run_dir), registry)
    with pytest.raises(ConfigError) as info:
        run_training(cfg, pset, registry)
    message = str(info.value)
    assert f"run_dir {run_dir} is not empty (checkpoints, metrics.jsonl, run.json)" in message
    for fix in ("--resume_from_checkpoint true", "a new --run_dir", "--overwrite"):
        assert fix in message
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == "old"  # untouched
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_empty_folders_and_a_stale_lock_are_not_a_previous_run(tmp_path: Path) -> None:
    (tmp_path / "logs" / "inference").mkdir(parents=True)
    (tmp_path / LOCK_FILE).write_text("")
    check_run_dir_free(tmp_path, resume=False, overwrite=False)


def test_overwrite_deletes_only_a_telescope_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    previous_run(run_dir)
    (run_dir / LOCK_FILE).write_text("")
    check_run_dir_free(run_dir, resume=False, overwrite=True)
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]

    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("keep me")
    with pytest.raises(ConfigError, match="holds no Telescope run .* will not delete it"):
        check_run_dir_free(other, resume=False, overwrite=True)
    assert (other / "thesis.tex").read_text() == "keep me"


def test_overwrite_is_a_bare_cli_flag(tmp_path: Path) -> None:
    from telescope.core.config import load_config_with_sources

    _, registry = load_plugins()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(tmp_path / "run")))
    cfg, _ = load_config_with_sources(config, ["--overwrite", "--seed", "4"], registry)
    assert cfg.overwrite is True and cfg.seed == 4
    with pytest.raises(ConfigError, match="seed"):
        load_config_with_sources(config, ["--seed", "--overwrite"], registry)
