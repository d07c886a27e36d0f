"""Console logger: plain lines without a TTY, the progress line's fields, ETA."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from rich.console import Console

from telescope.core.observe.console import ConsoleLogger, format_duration, format_progress
from telescope.core.testing import make_config


def test_format_progress_fields() -> None:
    metrics = {
        "reward/mean": 0.51234,
        "perf/step_time_s": 2.5,
        "perf/tokens_per_s": 1234.4,
        "perf/async_level": 1,
    }
    line = format_progress(3, 10, metrics, discarded=5, cancelled=2, eta_s=125)
    assert line == (
        "step 3/10 | ETA 2m05s | reward 0.5123 | step 2.50s | 1,234 tok/s | async 1 | discarded 5 | cancelled 2"
    )
    assert "reward - | step - | - tok/s | async -" in format_progress(1, 2, {}, 0, 0, None)
    assert format_progress(1, 2, {"timing_step_total": 3.0}, 0, 0, None).split(" | ")[3] == "step 3.00s"
    assert (format_duration(3725), format_duration(42), format_duration(None)) == ("1h02m", "42s", "?")


def test_plain_mode_when_not_a_tty(tmp_path: Path) -> None:
    buf = io.StringIO()
    logger = ConsoleLogger(console=Console(file=buf, width=200))
    assert logger.plain  # a StringIO is not a terminal
    logger.start(make_config(number_of_steps=4, use_wandb=False), tmp_path)
    for step in range(4):  # 0-based steps: step 0 is the first one done
        logger.log_step(step, {"reward/mean": step / 4, "discarded/count": 2, "cancelled/count": 1})
    logger.warn("server 1 is slow")
    logging.getLogger("telescope.rewards").warning("reward fn timed out")
    logging.getLogger("telescope.rewards").info("not shown")
    logging.getLogger("telescope.observe").warning("already sent", extra={"telescope_hub_warning": True})
    logger.finish("finished")
    logging.getLogger("telescope.rewards").warning("after finish")
    lines = buf.getvalue().splitlines()
    progress = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in progress] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert progress[-1].endswith("discarded 8 | cancelled 4") and "ETA 0s" in progress[-1]
    assert "WARNING: server 1 is slow" in lines
    assert "WARNING: [telescope.rewards] reward fn timed out" in lines
    assert not any(t in buf.getvalue() for t in ("not shown", "already sent", "after finish"))
    assert lines[-1].startswith("run finished after") and "\x1b[" not in buf.getvalue()


def test_live_mode_renders_on_a_terminal(tmp_path: Path) -> None:
    buf = io.StringIO()
    logger = ConsoleLogger(console=Console(file=buf, width=200, force_terminal=True))
    assert not logger.plain
    logger.start(make_config(number_of_steps=2, use_wandb=False), tmp_path)
    logger.log_step(1, {"reward/mean": 0.25})
    logger.log_step(2, {"reward/mean": 0.75})
    logger.finish("finished")
    out = buf.getvalue()
    assert "2/2" in out and "reward 0.7500" in out


def test_eta_uses_mean_step_time(tmp_path: Path) -> None:
    clock = iter([0.0, 100.0, 110.0, 130.0])  # construction, start, then the two ETA reads
    logger = ConsoleLogger(console=Console(file=io.StringIO()), plain=True, clock=lambda: next(clock))
    logger.start(make_config(number_of_steps=10, use_wandb=False), tmp_path)  # t0 = 100
    logger._first_done = 1
    assert logger.eta_seconds(1) == 10.0 * 9  # 10 s for one step, 9 left
    assert logger.eta_seconds(2) == 15.0 * 8  # 30 s for two steps, 8 left
