"""Console logger: plain lines without a TTY, a live status line under the step history on one
(a real pseudo-terminal), fitting 80 columns, and an ETA from step times only."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

from rich.console import Console

from telescope.core.observe.loggers.console import ConsoleLogger, LiveStatus, format_duration, format_progress
from telescope.core.observe.loggers.progress import StepProgress, fit_fields, progress_fields
from telescope.core.observe.stdio import PlainLines, PlainStdio, StdioCapture
from telescope.core.testing import make_config

METRICS = {
    "reward/mean": 0.51234,
    "perf/step_time_s": 2.5,
    "perf/tokens_per_s": 1234.4,
    "perf/async_level": 1,
}
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>78]")


def test_format_progress_fields() -> None:
    line = format_progress(3, 10, METRICS, discarded=5, cancelled=2, eta_s=125)
    assert line == (
        "step 3/10 | ETA 2m05s | reward 0.5123 | step 2.50s | 1,234 tok/s | async 1 | discarded 5 | cancelled 2"
    )
    assert "reward - | step - | - tok/s | async -" in format_progress(1, 2, {}, 0, 0, None)
    assert format_progress(1, 2, {"timing_step_total": 3.0}, 0, 0, None).split(" | ")[3] == "step 3.00s"
    assert (format_duration(3725), format_duration(42), format_duration(None)) == ("1h02m", "42s", "?")


def test_narrow_lines_drop_the_least_important_fields_first() -> None:
    fields = progress_fields(3, 10, METRICS, 5, 2, 125)
    # ranks: async (5) goes first, then tok/s (4), step time (3), cancelled then discarded (2), reward (1)
    assert fit_fields(fields, 92) == (
        "step 3/10 | ETA 2m05s | reward 0.5123 | step 2.50s | 1,234 tok/s | discarded 5 | cancelled 2"
    )
    assert (
        fit_fields(fields, 80)
        == "step 3/10 | ETA 2m05s | reward 0.5123 | step 2.50s | discarded 5 | cancelled 2"
    )
    assert fit_fields(fields, 50) == "step 3/10 | ETA 2m05s | reward 0.5123"
    assert fit_fields(fields, 10) == "step 3/10 | ETA 2m05s"  # the step counter and ETA are never dropped


def test_plain_mode_when_not_a_tty(tmp_path: Path) -> None:
    buf = io.StringIO()
    logger = ConsoleLogger(console=Console(file=buf, width=40))
    assert logger.plain  # a StringIO is not a terminal
    logger.start(make_config(number_of_steps=4, use_wandb=False), tmp_path)
    for step in range(4):  # 0-based steps: step 0 is the first one done
        logger.log_step(step, {**METRICS, "discarded/count": 2, "cancelled/count": 1})
    logger.warn("server 1 is slow; " + "x" * 60)
    logging.getLogger("telescope.rewards").warning("reward fn timed out")
    logging.getLogger("telescope.rewards").info("not shown")
    logging.getLogger("telescope.observe").warning("already sent", extra={"telescope_hub_warning": True})
    logger.finish("finished")
    logging.getLogger("telescope.rewards").warning("after finish")
    out = buf.getvalue()
    lines = out.splitlines()
    progress = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in progress] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    # one unwrapped line per step although the console is 40 columns wide: every field is there
    assert all(len(ln) > 80 and ln.count(" | ") == 7 for ln in progress)
    assert progress[-1].endswith("discarded 8 | cancelled 4") and "ETA 0s" in progress[-1]
    assert "WARNING: server 1 is slow; " + "x" * 60 in lines
    assert "WARNING: [telescope.rewards] reward fn timed out" in lines
    assert not any(t in out for t in ("not shown", "already sent", "after finish"))
    assert lines[-1].startswith("run finished after") and "\x1b" not in out and "\r" not in out


def test_plain_mode_cleans_what_else_the_process_prints(tmp_path: Path) -> None:
    """Ray's copy of a worker line: cyan prefix, a transformers loading bar redrawn with \\r."""
    buf = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = buf  # type: ignore[assignment]
    capture = PlainStdio()
    try:
        capture.start()
        print(
            "\x1b[36m(TrainerWorker pid=7)\x1b[0m \rLoading weights:   0%|   | 0/26\rLoading weights: 100%|███| 26/26"
        )
        sys.stdout.write("\rtqdm 10%")
        sys.stdout.write("\rtqdm 100%\n")
        sys.stdout.write("no newline at the end")
    finally:
        capture.stop()
        sys.stdout = real_stdout
    assert buf.getvalue().splitlines() == [
        "(TrainerWorker pid=7) Loading weights: 100%|███| 26/26",
        "tqdm 100%",
        "no newline at the end",
    ]


def _live_run(tmp_path: Path, text: str) -> tuple[str, str]:
    """A run on a (forced) terminal that writes ``text`` to stderr: (telescope.stdout.log, the screen)."""
    shown = io.StringIO()
    capture = StdioCapture(tmp_path / "telescope.stdout.log")
    capture.start()
    try:
        logger = ConsoleLogger(console=Console(file=shown, width=120, force_terminal=True))
        logger.start(make_config(number_of_steps=2, use_wandb=False), tmp_path)
        sys.stderr.write(text)
        logger.finish("finished")
    finally:
        capture.stop()
    return (tmp_path / "telescope.stdout.log").read_text(), ANSI.sub("", shown.getvalue())


def test_on_a_terminal_what_the_process_prints_still_reaches_the_stdout_copy(tmp_path: Path) -> None:
    """The live display shows worker lines itself (rich's redirect): the run directory's copy gets them too."""
    copied, shown = _live_run(tmp_path, "\x1b[36m(TrainerWorker pid=7)\x1b[0m \rbar 0%\rbar 100%\n")
    assert copied == "(TrainerWorker pid=7) bar 100%\n"
    assert "(TrainerWorker pid=7) bar 100%" in shown


def test_on_a_terminal_a_last_line_without_newline_reaches_the_stdout_copy(tmp_path: Path) -> None:
    copied, _ = _live_run(tmp_path, "whole line\n\x1b[36m(TrainerWorker pid=7)\x1b[0m \rbar 0%\rbar 40%")
    assert copied == "whole line\n(TrainerWorker pid=7) bar 40%\n"  # the run ended mid-bar


def test_a_progress_bar_that_never_prints_a_newline_is_held_in_bounded_memory() -> None:
    buf = io.StringIO()
    lines = PlainLines(buf)
    lines.write("\x1b[36m(TrainerWorker pid=7)\x1b[0m ")
    for i in range(20_000):
        lines.write(f"\rLoading {i}/20000 " + "#" * (i % 50))
        assert lines.pending_chars < 200  # the prefix and the last two redraws, not 20,000 of them
    lines.write("\r   ")  # a blank redraw (a bar clearing itself) keeps the state before it
    assert buf.getvalue() == ""
    lines.flush_pending()
    assert buf.getvalue() == "(TrainerWorker pid=7) Loading 19999/20000 " + "#" * 49 + "\n"
    lines.write("\rdone 1\rdone 2\n")
    assert buf.getvalue().splitlines()[-1] == "done 2" and lines.pending_chars == 0


def test_eta_counts_step_times_not_start_up() -> None:
    now = [0.0]
    progress = StepProgress(10, clock=lambda: now[0])
    now[0] = 100.0  # 100 s of start-up (Ray, servers, model loading) before the first step ends
    assert progress.update(1, {"perf/step_time_s": 100.0}).eta_s is None  # its time includes start-up
    now[0] = 110.0
    assert progress.update(2, {}).eta_s == 10.0 * 8  # mean time between completions: 10 s
    now[0] = 130.0
    assert progress.update(3, {}).eta_s == 15.0 * 7  # (130 - 100) / 2 steps


def test_live_status_line_counts_down_and_fits() -> None:
    now = [0.0]
    status = LiveStatus(10, clock=lambda: now[0])
    now[0] = 65.0
    assert status.text(120).plain.endswith("step 0/10 | ETA ? | starting 1m05s")
    progress = StepProgress(10, clock=lambda: now[0])
    progress.update(1, METRICS)
    now[0] = 70.0
    status.last = progress.update(2, METRICS)  # 5 s per step, 8 left: ETA 40 s
    now[0] = 80.0
    wide, narrow = status.text(160).plain, status.text(80).plain
    assert "step 2/10 | ETA 30s | reward 0.5123" in wide and "async 1" in wide
    assert len(narrow) <= 80 and "step 2/10 | ETA 30s" in narrow and "async" not in narrow
    assert narrow.startswith("━" * 4 + "─" * 16 + " step 2/10")  # a bar of 80 // 4 columns, 2/10 filled


def run_in_pty(script: str, columns: int, tmp_path: Path) -> str:
    """Run ``script`` with stdout and stderr on a real pseudo-terminal ``columns`` wide; what it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    path = tmp_path / "live.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.Popen([sys.executable, str(path)], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode("utf-8", errors="replace")


LIVE_RUN = """
    import sys, time
    from pathlib import Path
    from telescope.core.observe.loggers.console import ConsoleLogger
    from telescope.core.testing import make_config

    logger = ConsoleLogger()
    assert not logger.plain, "stderr should be a terminal"
    logger.start(make_config(number_of_steps=4, use_wandb=False), Path("."))
    metrics = {"reward/mean": 0.5, "perf/step_time_s": 0.2, "perf/tokens_per_s": 12345.0, "perf/async_level": 1}
    for step in range(1, 5):
        time.sleep(0.3)
        print(f"\\x1b[36m(TrainerWorker pid=9)\\x1b[0m \\rbar 0%\\rworker line {step}", file=sys.stderr)
        logger.log_step(step, {**metrics, "discarded/count": 1})
        time.sleep(0.6)  # the status line refreshes twice a second
    logger.finish("finished")
    assert sys.stderr.__class__.__name__ == "TextIOWrapper", sys.stderr  # every wrapper removed
"""


def screen_lines(raw: str) -> list[str]:
    """The lines left on the screen, roughly: escape codes dropped, a \\r-redrawn row in its last state."""
    lines = []
    for row in ANSI.sub("", raw).split("\n"):
        last = [seg for seg in row.split("\r") if seg.strip()]
        if last:
            lines.append(last[-1].rstrip())
    return lines


def status_lines(raw: str) -> list[str]:
    """Every drawing of the status line (each redraw starts after a \\r; the bar leads it)."""
    segments = re.split(r"[\r\n]", ANSI.sub("", raw))
    return [seg.rstrip() for seg in segments if seg.startswith(("━", "─"))]


def test_tty_keeps_a_step_history_above_a_status_line(tmp_path: Path) -> None:
    raw = run_in_pty(LIVE_RUN, 120, tmp_path)
    assert "\x1b[" in raw  # live mode drew with escape codes
    lines = screen_lines(raw)
    history = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in history] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert all("12,345 tok/s" in ln and "async 1" in ln for ln in history)  # 120 columns: every field
    status = status_lines(raw)
    assert any("step 2/4 | ETA" in ln for ln in status) and any("starting" in ln for ln in status)
    assert [ln for ln in lines if "worker line" in ln] == [
        f"(TrainerWorker pid=9) worker line {i}" for i in range(1, 5)
    ]
    assert lines[-1].startswith("run finished after")


def test_tty_at_80_columns_keeps_the_step_counter_and_eta(tmp_path: Path) -> None:
    raw = run_in_pty(LIVE_RUN, 80, tmp_path)
    lines = screen_lines(raw)
    history = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(" | ")[:2] for ln in history][-1] == ["step 4/4", "ETA 0s"]
    assert len(history) == 4 and all(len(ln) <= 80 and "ETA" in ln for ln in history)
    starts = ("telescope run", "(TrainerWorker", "step ", "━", "─", "run finished")
    assert all(ln.startswith(starts) for ln in lines), lines  # fitted: no row wrapped onto a second one
    status = [ln for ln in status_lines(raw) if "step 3/4" in ln]
    assert status and all(len(ln) <= 80 and "ETA" in ln and "|" in ln for ln in status)


def test_live_mode_renders_on_a_forced_terminal(tmp_path: Path) -> None:
    buf = io.StringIO()
    logger = ConsoleLogger(console=Console(file=buf, width=200, force_terminal=True))
    assert not logger.plain
    logger.start(make_config(number_of_steps=2, use_wandb=False), tmp_path)
    logger.log_step(1, {"reward/mean": 0.25})
    logger.log_step(2, {"reward/mean": 0.75})
    logger.finish("finished")
    out = buf.getvalue()
    assert "step 2/2" in out and "reward 0.7500" in out
