"""Infrastructure failures reach the reader: ``telescope runs show`` (and ``--json``) and the console's
step line name them by cause when the run had any, and say nothing when it had none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the run writer of test_runs_show

from test_runs_show import TIMING, show, start_hub, step_rows

from telescope.core.infra import summary
from telescope.core.observe import rollout_metrics
from telescope.core.observe.loggers.progress import format_progress

INFRA = {  # what InfraLedger.step_metrics reports after 7 failed attempts, 3 of them in a sandbox pool
    "totals/infra/failed": 7.0,
    "totals/infra/retried": 6.0,
    "totals/infra/masked": 1.0,
    "totals/infra/cause/server_error": 2.0,
    "totals/infra/cause/sandbox_create": 8.0,
}


def write_run(run_dir: Path, infra: dict[str, float]) -> Path:
    hub = start_hub(run_dir, model="telescope/tiny")
    for step in (1, 2):
        rows = step_rows(step)
        hub.log_rollouts(step, rows)
        hub.log_step(step, {**TIMING, **rollout_metrics(rows), **(infra if step == 2 else {})})
    hub.finish("finished")
    return run_dir


def test_runs_show_names_the_failures_by_cause_in_the_order_of_the_causes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", INFRA)
    line = "infra 7 failed (6 retried, 1 masked): sandbox_create 8, server_error 2"
    assert f"Infrastructure (all steps): {line}" in " ".join(show(str(run)).split())
    assert json.loads(show(str(run), "--json"))["infra"] == line


def test_a_run_without_infrastructure_failures_shows_none(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"totals/infra/failed": 0.0})
    assert "Infrastructure" not in show(str(run))
    assert json.loads(show(str(run), "--json"))["infra"] is None
    assert summary({"infra/failed": 0.0}) is None


def test_the_step_line_carries_them_only_when_non_zero() -> None:
    assert "infra" not in format_progress(1, 3, {"reward/mean": 0.5}, 0, 0, None)
    line = format_progress(1, 3, {"reward/mean": 0.5, **INFRA}, 0, 0, None)
    assert line.endswith("| infra 7 failed (6 retried, 1 masked): sandbox_create 8, server_error 2")
