"""logs/telescope.stdout.log: what the process prints, copied while the local logger runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from telescope.core.observe import LoggerHub, stdio
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.stdio import StdioCapture, StreamTee, plain_line, strip_ansi, tail_lines
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


def _whole_file_tail(path: Path, lines: int) -> list[str]:
    """A second implementation: read it all, split on newlines only, clean each line."""
    text = path.read_bytes().decode("utf-8", errors="replace").rstrip("\n")
    return [plain_line(line) for line in text.split("\n")[-lines:]] if text and lines > 0 else []


@pytest.mark.parametrize("chunk", [1, 3, 7, 64 * 1024])
def test_tail_lines_reads_back_from_the_end_as_the_whole_file_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(stdio, "_TAIL_CHUNK", chunk)  # chunk edges inside lines and UTF-8 characters
    bodies = {
        "plain": "".join(f"line {i} ü\n" for i in range(50)),
        "no_end_newline": "a\nbb\nccc",
        "trailing_blank_lines": "a\nb\nc\n\n\n\n",
        "only_newlines": "\n\n\n",
        "empty": "",
        "bar": "\x1b[36m(TrainerWorker pid=7)\x1b[0m \rLoading 0%\rLoading 100%\nnext € line\n",
        "long_line": "x" * 1000 + "\nshort\n",
    }
    for name, body in bodies.items():
        path = tmp_path / f"{name}.log"
        path.write_text(body, encoding="utf-8")
        for lines in (0, 1, 2, 3, 30, 100):
            assert tail_lines(path, lines) == _whole_file_tail(path, lines), (name, lines)
    assert tail_lines(tmp_path / "bar.log", 2) == ["(TrainerWorker pid=7) Loading 100%", "next € line"]
    assert tail_lines(tmp_path / "missing.log") == []


def test_a_long_log_is_read_from_its_end_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"{i:08d}\n" for i in range(200_000)))  # 1.8 MB
    reads: list[int] = []
    real_open = open

    def counting_open(*args, **kwargs):  # type: ignore[no-untyped-def]
        f = real_open(*args, **kwargs)
        real_read = f.read
        f.read = lambda n=-1: reads.append(n) or real_read(n)  # type: ignore[method-assign]
        return f

    monkeypatch.setattr("builtins.open", counting_open)
    assert tail_lines(path, 3) == ["00199997", "00199998", "00199999"]
    assert reads == [64 * 1024]  # one chunk from the end, not the whole file


def test_strip_ansi_removes_colours_cursor_moves_and_titles() -> None:
    assert strip_ansi("\x1b[1;31mERROR\x1b[0m x\x1b[2K\x1b]0;title\x07 y\x1b[?25l") == "ERROR x y"
