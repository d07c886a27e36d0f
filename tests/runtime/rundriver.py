"""Shared helpers of the driver tests: a small real run config, CLI launches, run-directory reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ports import free_port_block

from telescope.core.testing import smallest_run_settings


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_meta(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "run.json").read_text()))


def settings(run_dir: Path, **overrides: Any) -> dict[str, Any]:
    """1 FSDP rank, 1 transformers server, the built-in tiny model: the smallest real run."""
    defaults = {"inference_base_port": free_port_block(1), "number_of_steps": 2, "run_dir": str(run_dir)}
    return smallest_run_settings(**{**defaults, **overrides})


def train_to_end(tmp_path: Path, timeout_s: float = 480, **overrides: Any) -> Path:
    """Write the smallest run's config with ``overrides`` to ``tmp_path/run.yaml``, train it to the end
    with the CLI (failing with the log's tail otherwise) and return its run directory."""
    import yaml

    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, **overrides)))
    assert finish(launch(config, log), log, timeout_s) == 0, log.read_text()[-3000:]
    return run_dir


def launch(config: Path, log: Path, *extra: str, prelude: str = "") -> subprocess.Popen[bytes]:
    """``telescope train CONFIG`` in a new session; ``prelude`` runs first (e.g. to inject a fault)."""
    code = f"{prelude}\nfrom telescope.cli.app import main; main()"
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, "train", str(config), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for(condition: Any, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> int:
    """Wait for the CLI; on time-out kill its whole session and fail with the log."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(
            f"training did not end within {timeout_s}s:\n{log.read_text()[-3000:]}"
        ) from None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def session_pids(sid: int) -> list[int]:
    """Processes still in session ``sid`` (what the CLI started: Ray, workers, servers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: session id
            out.append(int(entry.name))
    return out


def training_pid(sid: int) -> int:
    """The process that trains in session ``sid`` (launched with ``launch``): the CLI itself, or, when
    it re-ran itself inside the run's private network namespace (``cluster.netns``), that re-run: the
    child of ``unshare``."""
    for pid in session_pids(sid):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/comm").read_text().strip() == "unshare":
                return pid
        except (OSError, ValueError):
            continue
    return sid


def actor_pids(sid: int, actor_class: str) -> list[int]:
    """Processes of session ``sid`` that run a Ray actor of ``actor_class`` (``TrainerWorker``)."""
    out = []
    for pid in session_pids(sid):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if name.startswith(f"ray::{actor_class}".encode()):
            out.append(pid)
    return out


def enospc_prelude(path_part: str, good_writes: int = 0) -> str:
    """Code that makes the CLI's own writes to files whose path contains ``path_part`` fail as on a
    full disk (``OSError(ENOSPC)``, what ``write`` raises then) after ``good_writes`` writes.

    Injected at ``open`` of the driver process: the trainer and server processes write normally.
    """
    return f"""
import builtins, errno, io, os
_real_open = io.open
class _FullDisk:
    writes = 0
    def __init__(self, f):
        self._f = f
    def write(self, data):
        _FullDisk.writes += 1
        if _FullDisk.writes > {good_writes}:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()
    def __getattr__(self, name):
        return getattr(self._f, name)
def _open(file, mode="r", *args, **kwargs):
    f = _real_open(file, mode, *args, **kwargs)
    writing = any(m in mode for m in "wax+")
    return _FullDisk(f) if writing and {path_part!r} in str(file) else f
builtins.open = io.open = _open
"""
