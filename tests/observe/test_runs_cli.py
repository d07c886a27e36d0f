"""``telescope runs show`` on a run directory written by our own local logger."""

from __future__ import annotations

import re
from pathlib import Path

import zstandard
from typer.testing import CliRunner

from telescope.cli.commands.runs import app, sparkline
from telescope.core.observe import RunDirReader


def test_sparkline() -> None:
    assert sparkline([0.0, 1.0]) == "▁█"
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0, 2.0]) == "▅▅▅"
    assert len(sparkline([float(i) for i in range(500)], width=60)) == 60
    assert sparkline([]) == ""


def test_runs_show_summarises_the_run(synthetic_run: Path) -> None:
    result = CliRunner().invoke(
        app, ["show", str(synthetic_run), "--rollouts", "2", "--metrics", "100"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "synthetic" in out and "finished" in out and "steps logged 4" in out
    assert "algorithm" in out and "reverse_text" in out  # config highlights
    # reward/mean per step: (1 + step % 2 + 1.75) / 8 -> 0.46875, 0.34375, 0.46875, 0.34375
    assert "first 0.4688  last 0.3438  min 0.3438  max 0.4688" in out
    assert "█▁█▁" in out
    assert "stop_reason_length_pct" in out and "Latest step metrics (step 4)" in out
    for outcome, count, pct in (("kept", 32, "61.5"), ("max_async", 8, "15.4"), ("off_policy", 4, "7.7")):
        assert re.search(rf"│ {outcome}\s+│\s+{count} │\s+{pct}% │", out), outcome
    assert "zero_advantage samples by kind: all_zero 8" in out
    assert "Sample rollouts (step 4, 2 of 8 kept)" in out and "completion: <0:0> drow" in out
    assert "[reverse_text] group 0 #1  reward 0  adv -0.25  stop stop  tokens 6" in out


def test_runs_show_on_a_non_run_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 2


def test_runs_show_on_a_killed_run(synthetic_run: Path) -> None:
    with open(synthetic_run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "metr')  # the writer died mid-line
    block = synthetic_run / "rollouts" / "block_000000.jsonl.zst"
    before = len(RunDirReader(synthetic_run).rollouts())
    with open(block, "ab") as f:  # a writer died mid-frame; the resumed run appended a whole one after it
        f.write(b"(\xb5/\xfdtorn" + zstandard.ZstdCompressor().compress(b'{"step": 5, "group_id": 9}\n'))
    result = CliRunner().invoke(app, ["show", str(synthetic_run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "steps logged 4" in result.output
    assert "note: metrics.jsonl: an unfinished end ignored (torn by a killed writer" in result.output
    assert (
        "note: rollouts/block_000000.jsonl.zst: 1 torn or corrupt compressed frame(s) skipped (8 bytes)"
        in result.output
    )
    assert len(RunDirReader(synthetic_run).rollouts()) == before + 1
