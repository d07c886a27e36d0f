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
    # reward_saturated (warn) may come first: its groups finish while step 3 trains
    first = next(f for f in health["findings"] if f["action"] == "stop")
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


def test_a_run_that_goes_wrong_is_rolled_back_and_recovers(tmp_path: Path) -> None:
    """The learning rate warms up to 100x the quickstart's: healthy first steps (a checkpoint each),
    then KL to the sampler passes 0.5; the run restarts from a checkpoint before it at 0.02x the
    learning rate and finishes, KL back near 0."""
    code, run_dir, output = quickstart(
        tmp_path,
        learning_rate=0.05,
        warmup_steps=50,
        number_of_steps=16,
        checkpoint_every=1,
        health_kl_spike_action="rollback",
        health_kl_spike_max=0.5,
        health_rollback_lr_factor=0.02,
        health_max_rollbacks=1,
    )
    assert code == 0, output[-3000:]
    info = run_meta(run_dir)["info"]
    (restart,) = info["restarts"]
    finding = next(f for f in info["health"]["findings"] if f["action"] == "rollback")
    assert restart["health_rollback"] and restart["from_step"] <= finding["onset"] - 2
    assert info["health"]["rollbacks"] == 1 and info["health"]["learning_rate"] == pytest.approx(0.001)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    cut = next(i for i in range(1, len(rows)) if rows[i]["step"] <= rows[i - 1]["step"])  # the re-run starts
    before, after = rows[:cut], rows[cut:]
    assert after[0]["step"] == restart["from_step"] + 1 and after[-1]["step"] == 16
    # the re-run trains at the lowered rate: 0.02 x the warmup's value for the same step
    step = after[0]["step"]
    assert after[0]["metrics"]["learning_rate"] == pytest.approx(0.001 * step / 50, rel=1e-6)
    # the sampler agrees with the trainer again: measured KL 0.000-0.015 after the rollback (0.5-2.6
    # before it). The reward (bench/health.py rollback, 24 steps, docs/health.md): seed 0 0.439 at the
    # finding, mean 0.535 after; seed 1 0.412, 0.566. Single-step rewards are noisy and this run is
    # 16 steps, so it is not asserted here
    assert max(r["metrics"]["kl_divergence_inference"] for r in after) < 0.1
    assert max(r["metrics"]["kl_divergence_inference"] for r in before if r["step"] >= finding["onset"]) > 0.5
