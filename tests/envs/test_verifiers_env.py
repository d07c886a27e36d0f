"""The verifiers environment against the real verifiers library (its v1 stack), with tasksets written per
its docs in tests/envs/verifiers_tasksets. verifiers pins openai<3, so these run in .venv-verifiers
(`make test-verifiers`); elsewhere they skip."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from telescope.core.env.resolve import create_environment, environment_component_problems

vf = pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.verifiers

sys.path.insert(0, str(Path(__file__).parent / "verifiers_tasksets"))


def problems(registry: Any, **kwargs: Any) -> list[str]:
    return environment_component_problems(registry.get("environment", "verifiers"), kwargs, registry)


def test_tasks_become_samples_and_the_tasks_own_rewards_score(registry: Any) -> None:
    env = create_environment(
        registry, "verifiers", {"taskset": "vf_reverse", "taskset_args": {"words": ["abc", "xyz"]}}
    )
    samples = env.load_dataset()
    assert [(s.prompt, s.answer) for s in samples] == [("reverse: abc", "cba"), ("reverse: xyz", "zyx")]
    task = env._tasks[0]
    assert env.initial_messages(task) == [
        {"role": "system", "content": "Reverse the word."},
        {"role": "user", "content": "reverse: abc"},
    ]
    for reply, overlap, exact in (("cba", 1.0, 1.0), ("c?a", 2 / 3, 0.0), ("", 0.0, 0.0)):
        trace = env.build_trace(
            task, [*env.initial_messages(task), {"role": "assistant", "content": reply}], {2}, "stop"
        )
        assert trace.last_reply == reply and trace.num_turns == 1
        asyncio.run(task.score(trace))
        assert trace.rewards["overlap"].score == pytest.approx(overlap)
        assert trace.rewards["exact"].score == exact and trace.rewards["exact"].weight == 0.5
        assert trace.reward == pytest.approx(overlap + 0.5 * exact)
        assert trace.metrics == {"reply_chars": float(len(reply))}


def test_unsupported_features_are_refused_by_name(registry: Any) -> None:
    found = problems(registry, taskset="vf_boxed")
    assert any("stop conditions (said_done) are not supported" in p for p in found), found
    assert any("rewards/metrics that need a runtime (tests_pass) are not supported" in p for p in found), (
        found
    )
    (missing,) = problems(registry, taskset="vf_revers")
    assert "taskset: 'vf_revers' does not load: ModuleNotFoundError: taskset 'vf_revers' not found" in missing
    (bad,) = problems(registry, taskset="vf_reverse", taskset_args={"wordz": ["a"]})
    assert "wordz" in bad and "Extra inputs are not permitted" in bad
    (unnamed,) = problems(registry)
    assert "name a verifiers taskset" in unnamed


def test_config_validate_names_the_feature(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from telescope.cli.app import app

    config = tmp_path / "run.yaml"
    config.write_text(
        "model: telescope/tiny\nenvironments:\n  - name: verifiers\n    kwargs: {taskset: vf_boxed}\n"
    )
    result = CliRunner().invoke(app, ["config", "validate", str(config)])
    assert result.exit_code == 2, result.output
    assert "stop conditions (said_done) are not supported" in result.output


def test_the_guides_taskset_and_config_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/environments.md's verifiers example (skipped by test_environments_doc.py without verifiers)."""
    import re

    from telescope.cli.context import load_run

    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", doc, re.DOTALL | re.MULTILINE)
    (taskset,) = [text for kind, text in blocks if text.startswith("# file: reverse_taskset.py")]
    (config,) = [text for kind, text in blocks if kind == "yaml" and "name: verifiers" in text]
    (tmp_path / "reverse_taskset.py").write_text(taskset)
    (tmp_path / "run.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    run = load_run(tmp_path / "run.yaml", ["--use_wandb", "false"])  # .venv-verifiers has no wandb
    assert run.cfg.environments[0].kwargs["taskset"] == "reverse_taskset"


def test_env_check_plays_one_task_against_the_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from telescope.cli.app import app

    monkeypatch.chdir(Path(__file__).parent / "verifiers_tasksets")
    result = CliRunner().invoke(
        app, ["env", "check", "verifiers", "-p", "vf_reverse.py", "--kwargs", "{taskset: vf_reverse}"]
    )
    assert result.exit_code == 0, result.output
    assert "1 call(s)" in result.output and "every check passed" in result.output
