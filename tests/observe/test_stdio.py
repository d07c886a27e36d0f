"""logs/telescope.stdout.log: what the process prints, copied while the local logger runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from telescope.core.observe import LoggerHub
from telescope.core.observe.local import LocalLogger
from telescope.core.observe.stdio import StdioCapture, StreamTee
from telescope.core.testing import make_config


def test_local_logger_copies_stdout_and_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (sys.stdout, sys.stderr)
    hub = LoggerHub([LocalLogger()])
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    print("to stdout")
    print("to stderr", file=sys.stderr)
    sys.stdout.writelines(["line a\n", "line b\n"])
    hub.finish("finished")
    print("after finish")
    assert (sys.stdout, sys.stderr) == before  # the original streams are back
    text = (tmp_path / "logs" / "telescope.stdout.log").read_text()
    assert text == "to stdout\nto stderr\nline a\nline b\n"
    seen = capsys.readouterr()  # and everything still reached the real streams
    assert seen.out == "to stdout\nline a\nline b\nafter finish\n" and seen.err == "to stderr\n"


def test_resumed_run_appends(tmp_path: Path) -> None:
    for word in ("first", "second"):
        capture = StdioCapture(tmp_path / "out.log")
        capture.start()
        print(word)
        capture.stop()
    assert (tmp_path / "out.log").read_text() == "first\nsecond\n"


class _Wrapper:
    """Stands in for a later wrapper of sys.stdout (W&B's console capture, a test harness)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        return self.inner.write(text)  # type: ignore[attr-defined]

    def flush(self) -> None:
        self.inner.flush()  # type: ignore[attr-defined]


def test_stop_under_a_later_wrapper_leaves_a_pass_through_the_next_capture_drops(tmp_path: Path) -> None:
    original = sys.stdout
    first = StdioCapture(tmp_path / "first.log")
    first.start()
    tee = sys.stdout
    assert isinstance(tee, StreamTee) and tee.inner is original
    sys.stdout = _Wrapper(tee)  # type: ignore[assignment]
    try:
        first.stop()  # cannot unwrap: the wrapper is on top
        print("after the first stop")
        assert isinstance(sys.stdout, _Wrapper) and not tee.active
    finally:
        sys.stdout = sys.stdout.inner  # type: ignore[attr-defined]  # the wrapper removes itself
    assert sys.stdout is tee
    second = StdioCapture(tmp_path / "second.log")
    second.start()
    try:
        assert isinstance(sys.stdout, StreamTee) and sys.stdout.inner is original  # the dead tee is gone
        print("second run")
    finally:
        second.stop()
    assert sys.stdout is original
    assert (tmp_path / "first.log").read_text() == ""
    assert (tmp_path / "second.log").read_text() == "second run\n"


def test_double_start_is_a_clear_error(tmp_path: Path) -> None:
    capture = StdioCapture(tmp_path / "x.log")
    capture.start()
    try:
        with pytest.raises(RuntimeError, match="already running: call stop"):
            capture.start()
    finally:
        capture.stop()
