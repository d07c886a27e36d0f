"""An OpenEnv environment (telescope.envs.openenv_demo, written per OpenEnv's template), started
locally, trains in a real run: the model plays its episodes turn by turn through the gateway, every turn is
captured in token ids, and the reward is the environment's."""

from __future__ import annotations

from pathlib import Path

import pytest
from rundriver import train_to_end

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")
pytest.importorskip("openenv.core")


@pytest.mark.slow
def test_a_local_openenv_environment_trains_end_to_end(tmp_path: Path) -> None:
    kwargs = {
        "app": "telescope.envs.openenv_demo:app",
        "observation_field": "text",
        "max_turns": 2,
        "num_samples": 6,
    }
    run_dir = train_to_end(tmp_path, environments=[{"name": "openenv", "kwargs": kwargs}], max_tokens=6)
    reader = RunDirReader(run_dir)
    rows = [r for r in reader.rollouts() if r.get("discard_reason") is None]
    assert rows, "no trained rollouts"
    for row in rows:
        steps = row["sample_metrics"]["env_steps"]
        assert steps in (1.0, 2.0) and row["num_turns"] == steps == row["sample_metrics"]["agent/calls"]
        assert row["sample_metrics"]["env_done"] == 1.0  # solved, or both tries used
        assert row["sample_metrics"]["env_reward_missing"] == 0.0
        assert row["reward"] == pytest.approx(row["sample_metrics"]["env_reward"])
        assert 0.0 <= row["reward"] <= 2.0
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) > 0
        assert "reverse: " in row["prompt_text"]
    assert any(r["num_turns"] == 2 for r in rows)  # the environment's "try again" came back as a user turn
    assert reader.steps()[-1]["step"] == 2
