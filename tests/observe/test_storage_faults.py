"""Run-directory write failures stop the run and name the file; identical warnings are rate-limited."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from telescope.core.observe import LoggerHub
from telescope.core.observe.logfilter import RepeatFilter
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.rundir.jsonl import JsonlWriter
from telescope.core.observe.rundir.storage import StorageError, describe_os_error
from telescope.core.testing import make_config


class FullFile:
    """A file whose every write fails as on a full disk."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.closed = False

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def test_the_errno_is_named_through_wrappers() -> None:
    class RayTaskErrorLike(RuntimeError):
        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::TrainerWorker.save_checkpoint() ...")
            self.cause = cause

    assert describe_os_error(RayTaskErrorLike(OSError(errno.ENOSPC, "x"))) == "disk full (ENOSPC)"
    assert describe_os_error(OSError(errno.EDQUOT, "x")) == "disk quota exceeded (EDQUOT)"
    assert describe_os_error(ValueError("bad")) == "ValueError: bad"


def test_a_run_directory_write_failure_is_fatal_and_names_the_file(tmp_path: Path) -> None:
    local = LocalLogger()
    hub = LoggerHub([local])
    fatal: list[StorageError] = []
    hub.on_fatal = fatal.append
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    hub.log_step(1, {"loss": 1.0})
    writer: JsonlWriter = local._writers["metrics.jsonl"]
    writer._file = FullFile(writer._file)  # type: ignore[assignment]
    hub.log_step(2, {"loss": 2.0})
    hub.log_step(3, {"loss": 3.0})
    assert [str(e) for e in fatal] == [
        f"{tmp_path / 'metrics.jsonl'} could not be written: disk full (ENOSPC)"
    ]
    assert hub.failures[("local", "log_step")] == 2  # told once, counted every time
    hub.finish("failed")  # the broken file does not keep run.json from its final status
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_without_a_handler_the_write_failure_is_raised(tmp_path: Path) -> None:
    local = LocalLogger()
    hub = LoggerHub([local])
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    local._writers["metrics.jsonl"]._file = FullFile(local._writers["metrics.jsonl"]._file)  # type: ignore[assignment]
    with pytest.raises(StorageError, match="metrics.jsonl could not be written: disk full"):
        hub.log_step(1, {"loss": 1.0})
    hub.finish("failed")


def record(text: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("telescope.runtime", level, __file__, 1, text, None, None)


def test_identical_warnings_pass_once_per_window_with_a_count() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=60, clock=lambda: now[0])
    shown = []
    for i in range(1000):
        now[0] = i * 0.1  # 100 s of the same warning every 0.1 s, plus an interleaved other one
        for rec in (record("server 0: connection refused"), record(f"step {i // 500}")):
            if repeats.filter(rec):
                shown.append(rec.getMessage())
    # at 0 s and at 60 s the first; the second says how many (599) it stood for; "step N" once each
    assert shown == [
        "server 0: connection refused",
        "step 0",
        "step 1",  # at 50 s
        "server 0: connection refused (repeated 599 more times in the last 60 s, not shown)",
    ]
    info = record("progress", logging.INFO)
    assert all(repeats.filter(record("progress", logging.INFO)) for _ in range(5)) and repeats.filter(info)


def test_every_handler_sharing_the_filter_shows_what_the_first_showed() -> None:
    shared = RepeatFilter(window_s=60)  # on telescope.log and on the console: one record, one decision
    first = record("same")
    assert shared.filter(first) and shared.filter(first)
    again = record("same")
    assert not shared.filter(again) and not shared.filter(again)
