"""reasoning-gym tasks train in a real run (Ray, the transformers engine, FSDP, the tiny model), one task
and several; every recorded reward is the library's own score of the recorded completion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rundriver import train_to_end

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")
rg = pytest.importorskip("reasoning_gym")


def train(tmp_path: Path, kwargs: dict[str, Any]) -> RunDirReader:
    environments = [{"name": "reasoning_gym", "kwargs": kwargs}]
    return RunDirReader(train_to_end(tmp_path, environments=environments, max_tokens=8))


def check_rewards(
    reader: RunDirReader, datasets: dict[str, Any], tasks_in_order: list[str]
) -> list[dict[str, Any]]:
    """Each kept rollout's reward is ``score_answer`` of its own text on the entry at its dataset index."""
    rows = [r for r in reader.rollouts() if r.get("discard_reason") is None]
    assert rows, "no trained rollouts"
    for row in rows:
        task = tasks_in_order[row["prompt_idx"] % len(tasks_in_order)]  # the environment interleaves tasks
        entry = datasets[task][row["prompt_idx"] // len(tasks_in_order)]
        answer = rg.utils.extract_answer(row["completion_text"])  # the stop text is outside any tags
        assert row["reward"] == datasets[task].score_answer(answer, entry)
        assert row["sample_tags"] == {"task": task}
        assert row["golden_answers"] == {"score": entry["answer"]}
        assert row["prompt_text"].count(entry["question"]) == 1
        assert row["sample_metrics"]["reward_error"] == 0.0
    return rows


@pytest.mark.slow
def test_one_reasoning_gym_task_trains(tmp_path: Path) -> None:
    reader = train(tmp_path, {"task": "basic_arithmetic", "size": 50, "seed": 3, "max_terms": 3})
    library = {"basic_arithmetic": rg.create_dataset("basic_arithmetic", size=50, seed=3, max_terms=3)}
    check_rewards(reader, library, ["basic_arithmetic"])
    steps = reader.steps()
    assert [s["step"] for s in steps] == [1, 2]
    assert "sample_metrics/answer_found/mean" in steps[0]["metrics"]


@pytest.mark.slow
def test_several_reasoning_gym_tasks_train(tmp_path: Path) -> None:
    tasks = ["basic_arithmetic", "leg_counting"]
    kwargs = {"task": tasks, "size": 20, "seed": 1, "leg_counting": {"max_animals": 4}}
    reader = train(tmp_path, kwargs)
    library = {
        "basic_arithmetic": rg.create_dataset("basic_arithmetic", size=20, seed=1),
        "leg_counting": rg.create_dataset("leg_counting", size=20, seed=1, max_animals=4),
    }
    rows = check_rewards(reader, library, tasks)
    seen = {row["sample_tags"]["task"] for row in rows}
    metrics = {k for s in reader.steps() for k in s["metrics"]}
    for task in seen:
        assert f"sample_metrics/score/{task}/mean" in metrics
