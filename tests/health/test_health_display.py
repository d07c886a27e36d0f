"""A run's findings where the user looks: the real sentinel and LoggerHub on one plugin manager write
the run directory, ``telescope runs show`` (text and ``--json``) and the dashboard's run API read it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pluggy
from test_sentinel import collapse_run, config
from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.core import hookspecs
from telescope.core.health import HEALTH_PLUGIN
from telescope.core.health.sentinel import HealthSentinel

sys.path.insert(0, str(Path(__file__).parents[1] / "ui"))  # the run writers of the dashboard tests

from ui_runs import start_hub


def collapsed_run(tmp_path: Path) -> Path:
    """Steps 1-13 of ``collapse_run`` through the hub (the run directory) with the sentinel on."""
    run_dir = tmp_path / "run"
    hub = start_hub(run_dir)
    pm = pluggy.PluginManager("telescope")
    pm.add_hookspecs(hookspecs)
    pm.register(hub, name="core.logger_hub")
    pm.register(HealthSentinel(config(tmp_path), pm.hook, fail=lambda err: None), name=HEALTH_PLUGIN)
    for step, metrics in enumerate(collapse_run(), start=1):
        pm.hook.telescope_step_end(step=step, metrics=metrics, rollouts=[])
    hub.finish("finished")
    return run_dir


def test_runs_show_prints_the_findings(tmp_path: Path) -> None:
    run_dir = collapsed_run(tmp_path)
    result = CliRunner().invoke(app, ["runs", "show", str(run_dir), "--metrics", "0", "--rollouts", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index("Health warning: 1 finding(s)")
    assert lines[at + 1].startswith(
        "  step 12  entropy_collapse (warn): entropy 0.2 is below 0.25 x its median"
    )
    data = json.loads(CliRunner().invoke(app, ["runs", "show", str(run_dir), "--json"]).stdout)
    (finding,) = data["health_findings"]["findings"]
    assert (finding["name"], finding["step"], finding["onset"], finding["action"]) == (
        "entropy_collapse",
        12,
        11,
        "warn",
    )
    # the step metrics the loggers recorded carry the finding while it lasted
    marks = {s["step"]: s["metrics"]["health/entropy_collapse"] for s in data["steps"]}
    assert [marks[s] for s in (10, 11, 12, 13)] == [0.0, 0.0, 1.0, 0.0]


def test_a_healthy_run_says_ok(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hub = start_hub(run_dir)
    pm = pluggy.PluginManager("telescope")
    pm.add_hookspecs(hookspecs)
    pm.register(hub, name="core.logger_hub")
    pm.register(HealthSentinel(config(tmp_path), pm.hook, fail=lambda err: None), name=HEALTH_PLUGIN)
    pm.hook.telescope_run_start(config=config(tmp_path), run_dir=str(run_dir))
    hub.finish("finished")
    result = CliRunner().invoke(app, ["runs", "show", str(run_dir), "--metrics", "0", "--rollouts", "0"])
    assert "Health ok: 0 finding(s)" in result.stdout.splitlines()


def test_a_run_without_a_sentinel_shows_no_health_line(tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "old")
    hub.finish("finished")
    result = CliRunner().invoke(app, ["runs", "show", str(tmp_path / "old")])
    assert result.exit_code == 0 and "Health" not in result.stdout
