"""``telescope runs show``: metric order, the model's name, ``--metrics 0`` and ``--json``,
run through the real command on run directories our own loggers write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.core.observe import rollout_metrics
from telescope.core.observe.rundir.reader import RunDirReader

sys.path.insert(0, str(Path(__file__).parents[1] / "ui"))  # the run writers of the dashboard tests

from ui_runs import start_hub, step_rows

runner = CliRunner()
#: What the driver hands the loggers for ``telescope/tiny-reverse``: the folder it was built in.
RESOLVED = "/home/someone/.cache/telescope/models/telescope--tiny-reverse"
TRAINER = {
    "loss": 0.125,
    "entropy": 1.5,
    "kl_divergence_inference": 0.01,
    "grad_norm": 2.5,
    "learning_rate": 1e-6,
    "zeta": 7.0,
}
TIMING = {f"timing_{name}_total": 0.1 for name in ("step", "forward", "backward", "data_to_device")}


def write_run(run_dir: Path, steps: int = 3) -> Path:
    hub = start_hub(run_dir, model=RESOLVED)
    for step in range(1, steps + 1):
        rows = step_rows(step)
        hub.log_rollouts(step, rows)
        hub.log_step(step, {**TIMING, **rollout_metrics(rows), **TRAINER, "perf/step_time_s": 1.0})
    hub.log_eval(2, "math", {"pass@1": 0.5}, [{"prompt": "q", "completion": "a", "reward": 1.0}])
    hub.finish("finished")
    return run_dir


def show(*args: str) -> str:
    result = runner.invoke(app, ["runs", "show", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def metric_rows(out: str) -> list[str]:
    """``section/group/metric`` of each row of the latest-metrics table, in printed order."""
    lines = out.split("Latest step metrics", 1)[1].splitlines()
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 4 and cells[0] not in ("section", ""):
            rows.append("/".join(c for c in cells[:3] if c))
        elif line.startswith(("Latest evals", "Rollouts")):
            break
    return rows


def test_headline_metrics_come_first_then_sections_then_timing(tmp_path: Path) -> None:
    out = show(str(write_run(tmp_path / "run")), "--metrics", "200")
    rows = metric_rows(out)
    # General/x is how a key without "/" prints (section General, no group).
    assert rows[:5] == [
        "reward/mean",
        "General/loss",
        "General/entropy",
        "General/kl_divergence_inference",
        "General/grad_norm",
    ]
    sections = [r.split("/")[0] for r in rows[5:] if not r.startswith("General/timing_")]
    assert sections[0] == "General" and sections == sorted(sections, key=lambda s: (s != "General", s))
    timing = [i for i, r in enumerate(rows) if "timing_" in r]
    assert len(timing) == len(TIMING) and min(timing) == len(rows) - len(TIMING)
    assert rows.count("advantage/mean") == 1 and not any("advantage_mean" in r for r in rows)


def test_model_shows_as_the_user_named_it(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    assert RunDirReader(run_dir).config()["model"] == RESOLVED  # config.yaml keeps what workers loaded
    assert "│ model " in show(str(run_dir)) and "telescope/tiny-reverse" in show(str(run_dir))
    assert RESOLVED not in show(str(run_dir))
    # a run dir written before info.model: the built-in folder maps back to the name
    meta = json.loads((run_dir / "run.json").read_text())
    del meta["info"]["model"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    assert "telescope/tiny-reverse" in show(str(run_dir)) and RESOLVED not in show(str(run_dir))


def test_metrics_zero_says_how_many_instead_of_an_empty_table(tmp_path: Path) -> None:
    out = show(str(write_run(tmp_path / "run")), "--metrics", "0")
    n = len(RunDirReader(tmp_path / "run").steps()[-1]["metrics"])
    assert f"Latest step metrics (step 3): {n} not listed (use --metrics N)" in out
    assert "section" not in out and "Latest evals: math (metrics not listed" in out


def test_json_round_trips_the_run_directory_records(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    got = json.loads(show(str(run_dir), "--json", "--rollouts", "2"))
    run = RunDirReader(run_dir)
    assert got["run"] == run.meta and got["config"] == run.config() and got["steps"] == run.steps()
    assert got["latest_evals"] == run.latest_evals() and got["model"] == "telescope/tiny-reverse"
    # step_rows: 8 kept, 2 max_async, 1 off_policy per step
    assert got["rollout_outcomes"] == {"kept": 24, "max_async": 6, "off_policy": 3}
    assert got["samples"] == [r for r in run.rollouts(3) if r["kept"]][:2]


def test_only_built_in_folders_map_back_to_a_name() -> None:
    from telescope.core.models.tiny import builtin_model_name

    assert builtin_model_name(RESOLVED) == "telescope/tiny-reverse"
    for other in ("Qwen/Qwen2.5-0.5B", "/models/telescope--no-such-model", "/models/my--tiny-reverse"):
        assert builtin_model_name(other) == other


def test_show_never_prints_escape_sequences_from_the_run_directory(tmp_path: Path) -> None:
    """A run directory is data from anywhere: a title-setting or screen-clearing sequence planted in
    run.json, a metric name or a sample must not reach the terminal."""
    run_dir = write_run(tmp_path / "run")
    meta = json.loads((run_dir / "run.json").read_text())
    meta["info"]["model"] = "evil\x1b]0;pwned\x07model"
    (run_dir / "run.json").write_text(json.dumps(meta))
    with (run_dir / "metrics.jsonl").open("a") as f:
        metrics = {"reward/mean": 0.5, "x\x1b[2Jcleared": 1.0, "bell\x07": 2.0}
        f.write(json.dumps({"step": 4, "time": 1.0, "metrics": metrics}) + "\n")
    out = show(str(run_dir), "--metrics", "100")
    assert "\x1b" not in out and "\x07" not in out
    assert "evilmodel" in out and "xcleared" in out  # the text is kept, the sequences dropped
