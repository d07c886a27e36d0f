"""examples/long_horizon.yaml trains for real (Ray, the transformers engine, FSDP, the tiny model):
episodes longer than max_model_len are compacted, every segment reaches the trainer, and the
trainer's step-0 logprobs of every trained token equal the sampled ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_the_long_horizon_example_compacts_and_trains_every_segment_exactly(tmp_path: Path) -> None:
    cfg = yaml.safe_load((EXAMPLES / "long_horizon.yaml").read_text())
    cfg.update(
        plugins=[str(EXAMPLES / "long_horizon_env.py")],
        run_dir=str(tmp_path / "run"),
        number_of_steps=1,
        group_size=2,
        prompts_batch_size_for_trainer=1,
        discard_group_zero_advantage=False,  # one group of two: train it whatever its rewards
    )
    cfg["environments"][0]["kwargs"] = {"max_turns": 12}  # ~600 tokens: past max_model_len (512)
    config, log = tmp_path / "run.yaml", tmp_path / "cli.log"
    config.write_text(yaml.safe_dump(cfg))
    assert finish(launch(config, log), log, 480) == 0, log.read_text()[-3000:]
    reader = RunDirReader(tmp_path / "run")
    (step,) = reader.steps()
    metrics = step["metrics"]
    rows = [r for r in reader.rollouts() if r.get("discard_reason") is None]
    assert len(rows) == 2
    for row in rows:
        kinds = [s["kind"] for s in row["segments"]]
        compactions = row["sample_metrics"]["agent/compactions"]
        assert compactions >= 1 and kinds.count("summary") == compactions
        assert kinds == ["conversation", "summary"] * int(compactions) + ["conversation"]
        assert row["sample_metrics"]["agent/context_tokens_max"] <= 512
    assert metrics["packing/samples"] == sum(len(r["segments"]) for r in rows)  # no segment dropped
    assert metrics["packing/dropped_overlong_samples"] == 0
    # the mean over every trained token of every segment (k3: no token's term is negative)
    assert metrics["kl_divergence_inference"] <= 1e-6
