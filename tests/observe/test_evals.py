"""Eval results: the hub fans ``log_eval`` out; local files, console line, ``runs show`` table."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from telescope.cli.commands.runs import app
from telescope.core.observe import Logger, LoggerHub, RunDirReader
from telescope.core.observe.loggers.console import ConsoleLogger, format_eval
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.rundir.jsonl import read_jsonl
from telescope.core.testing import make_config

ROWS = [
    {"prompt": "1+1", "completion": "2", "reward": 1.0},
    {"prompt": "2+2", "completion": "5", "reward": 0.0, "step": 99, "name": "row-name"},
]


class EvalRecorder(Logger):
    name = "recorder"

    def __init__(self) -> None:
        self.evals: list[tuple[int, str, dict[str, float], list[dict[str, Any]]]] = []

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self.evals.append((step, name, metrics, rows))


class BrokenEval(Logger):
    name = "broken"

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        raise RuntimeError("eval sink down")


def test_hub_fans_out_log_eval_and_survives_a_failing_logger(tmp_path: Path) -> None:
    rec = EvalRecorder()
    hub = LoggerHub([BrokenEval(), rec, Logger()])  # the base Logger ignores evals
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    hub.log_eval(5, "math", {"pass@1": 0.5}, ROWS)
    hub.log_eval(6, "math", {"pass@1": 0.75})
    hub.finish("finished")
    assert rec.evals == [(5, "math", {"pass@1": 0.5}, ROWS), (6, "math", {"pass@1": 0.75}, [])]
    assert hub.failures[("broken", "log_eval")] == 2


def _run_with_evals(run_dir: Path) -> None:
    hub = LoggerHub([LocalLogger()])
    hub.start(
        make_config(use_wandb=False, wandb_run_name="evals"), run_dir, system_metrics=False, ticker=False
    )
    hub.log_step(1, {"reward/mean": 0.5})
    hub.log_eval(0, "math", {"pass@1": 0.25, "accuracy": 0.2}, ROWS)
    hub.log_eval(0, "code", {"pass@1": 0.1}, [])
    hub.log_eval(2, "math", {"pass@1": 0.625, "accuracy": 0.6}, ROWS[:1])
    hub.finish("finished")


def test_local_writes_eval_metrics_and_samples(tmp_path: Path) -> None:
    _run_with_evals(tmp_path)
    metrics = read_jsonl(tmp_path / "evals" / "metrics.jsonl")
    assert [(m["step"], m["name"], m["metrics"], m["samples"]) for m in metrics] == [
        (0, "math", {"pass@1": 0.25, "accuracy": 0.2}, 2),
        (0, "code", {"pass@1": 0.1}, 0),
        (2, "math", {"pass@1": 0.625, "accuracy": 0.6}, 1),
    ]
    samples = read_jsonl(tmp_path / "evals" / "samples.jsonl")
    assert samples[0] == {"step": 0, "name": "math", "prompt": "1+1", "completion": "2", "reward": 1.0}
    assert samples[1]["step"] == 0 and samples[1]["row_step"] == 99 and samples[1]["row_name"] == "row-name"
    assert [(s["step"], s["prompt"]) for s in samples] == [(0, "1+1"), (0, "2+2"), (2, "1+1")]
    run = RunDirReader(tmp_path)
    assert {n: r["step"] for n, r in run.latest_evals().items()} == {"math": 2, "code": 0}
    assert [r["prompt"] for r in run.eval_samples(name="math", step=0)] == ["1+1", "2+2"]
    evals_on_timeline = [
        (e["phase"], e["step"], e["name"], e["attrs"]) for e in run.events() if e["type"] == "eval"
    ]
    assert evals_on_timeline == [
        ("instant", 0, "math", {"scores": {"pass@1": 0.25, "accuracy": 0.2}, "samples": 2}),
        ("instant", 0, "code", {"scores": {"pass@1": 0.1}, "samples": 0}),
        ("instant", 2, "math", {"scores": {"pass@1": 0.625, "accuracy": 0.6}, "samples": 1}),
    ]
    with open(tmp_path / "evals" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "name": "math", "metr')  # killed mid-line
    assert RunDirReader(tmp_path).latest_evals()["math"]["step"] == 2


def test_console_prints_one_line_per_eval() -> None:
    assert format_eval(10, "math", {"pass@1": 0.45, "accuracy": 0.4375}, 500) == (
        "eval math @ step 10: accuracy 0.4375, pass@1 0.4500 (500 samples)"
    )
    assert format_eval(1, "e", {f"m{i}": 1.0 for i in range(3)}, 0, limit=2) == (
        "eval e @ step 1: m0 1.0000, m1 1.0000, +1 more (0 samples)"
    )
    out = io.StringIO()
    console = ConsoleLogger(console=Console(file=out, width=200), plain=True)
    console.start(make_config(use_wandb=False), Path("."), None)
    console.log_eval(3, "math", {"pass@1": 0.5}, [{}, {}])
    console.finish("finished")
    assert "eval math @ step 3: pass@1 0.5000 (2 samples)\n" in out.getvalue()


def test_runs_show_prints_latest_evals(tmp_path: Path) -> None:
    _run_with_evals(tmp_path)
    result = CliRunner().invoke(app, ["show", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Latest evals" in out
    assert re.search(r"│ code │\s+0 │ pass@1\s+│\s+0\.1 │", out)
    assert re.search(r"│ math │\s+2 │ accuracy │\s+0\.6 │\n│\s+│\s+│ pass@1\s+│\s+0\.625 │", out)
    assert "0.25" not in out  # the step-0 math scores are not the latest
    short = CliRunner().invoke(app, ["show", str(tmp_path), "--metrics", "1"], env={"COLUMNS": "200"}).output
    assert "accuracy" in short and not re.search(r"pass@1\s+│\s+0\.625", short)
    assert "... 1 more eval metrics (use --metrics N)" in short
