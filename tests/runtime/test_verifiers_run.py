"""A verifiers taskset (written per verifiers' docs, tests/envs/verifiers_tasksets/vf_reverse.py) trains in a
real run: its model calls go through the run's gateway, are captured in token ids and trained, and each
rollout's reward is the taskset's own scoring of the recorded reply. Runs in .venv-verifiers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rundriver import train_to_end

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")
pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.verifiers

TASKSETS = Path(__file__).resolve().parents[1] / "envs" / "verifiers_tasksets"
TASKSET = TASKSETS / "vf_reverse.py"


@pytest.mark.slow
def test_a_verifiers_taskset_trains_end_to_end(tmp_path: Path) -> None:
    shutil.copy(TASKSET, tmp_path / "vf_reverse.py")  # loaded as a plugin file: its directory joins sys.path
    run_dir = train_to_end(
        tmp_path,
        environments=[{"name": "verifiers", "kwargs": {"taskset": "vf_reverse", "max_turns": 2}}],
        plugins=["vf_reverse.py"],
        max_tokens=6,
    )
    reader = RunDirReader(run_dir)
    rows = [r for r in reader.rollouts() if r.get("discard_reason") is None]
    assert rows, "no trained rollouts"
    for row in rows:
        assert row["num_turns"] == 1 and row["sample_metrics"]["agent/calls"] == 1.0
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) > 0
        reply = row["completion_text"].replace("<|im_end|>", "").strip()  # the gateway's content, stripped
        answer = row["prompt_text"].split("reverse: ")[-1].split("<")[0].strip()[::-1]
        overlap = sum(c in reply for c in answer) / len(answer)
        assert row["sample_metrics"]["overlap"] == pytest.approx(overlap), (reply, answer)
        assert row["sample_metrics"]["reply_chars"] == float(len(reply))
        assert row["reward"] == pytest.approx(overlap + 0.5 * float(reply == answer))
    assert reader.steps() and reader.steps()[-1]["step"] == 2


@pytest.mark.slow
def test_a_verifiers_tool_taskset_trains_end_to_end(tmp_path: Path) -> None:
    """vf_adder offers its vf.Toolset's tool on every call (the tiny model's template does not render tools,
    so it answers in text; test_verifiers_env.py plays the tool loop with a scripted model)."""
    shutil.copy(TASKSETS / "vf_adder.py", tmp_path / "vf_adder.py")
    run_dir = train_to_end(
        tmp_path,
        environments=[{"name": "verifiers", "kwargs": {"taskset": "vf_adder", "max_turns": 3}}],
        plugins=["vf_adder.py"],
        max_tokens=6,
    )
    rows = [r for r in RunDirReader(run_dir).rollouts() if r.get("discard_reason") is None]
    assert rows, "no trained rollouts"
    for row in rows:
        metrics = row["sample_metrics"]
        assert "agent_error" not in metrics or metrics["agent_error"] == 0.0, row["info_turns"]
        assert metrics["tool_calls"] == metrics["tool_results"] == float(row["num_turns"] - 1)
        assert row["reward"] == metrics["correct"]
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) > 0
