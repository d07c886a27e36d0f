"""The verifiers environment against the real verifiers library (its v1 stack), with tasksets written per
its docs in tests/envs/verifiers_tasksets. verifiers pins openai<3, so these run in .venv-verifiers
(`make test-verifiers`); elsewhere they skip."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.env.resolve import create_environment, environment_component_problems

vf = pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.verifiers

sys.path.insert(0, str(Path(__file__).parent / "verifiers_tasksets"))


class ScriptedModel:
    """Stand-in for ``openai.AsyncOpenAI`` (``client.chat.completions.create``) at the gateway boundary: replies
    from a script (text, or a tool call as ``(name, arguments JSON)``) and keeps every call's messages and
    tools. test_verifiers_run.py plays tasksets with the real gateway."""

    def __init__(self, *replies: Any) -> None:
        self.replies = iter(replies)
        self.calls: list[dict[str, Any]] = []
        self.chat = self.completions = self

    async def create(self, *, model: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
        self.calls.append({"messages": [dict(m) for m in messages], **extra})
        reply = next(self.replies)
        calls = None
        if isinstance(reply, tuple):
            function = SimpleNamespace(name=reply[0], arguments=reply[1])
            calls, reply = [SimpleNamespace(id=f"call_{len(self.calls)}", function=function)], ""
        message = SimpleNamespace(content=reply, tool_calls=calls)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")])


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
    assert any("toolset CountingTools keeps state (Counter), which is not supported" in p for p in found), (
        found
    )
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


def test_a_tool_taskset_runs_its_toolset_in_process(registry: Any) -> None:
    env = create_environment(registry, "verifiers", {"taskset": "vf_adder", "max_turns": 4})
    sample = env.load_dataset()[0]  # What is 2 + 3?
    model = ScriptedModel(
        ("calculator_add", '{"a": 2, "b": "x"}'), ("calculator_add", '{"a": 2, "b": 3}'), "5"
    )
    result = asyncio.run(env.run(model, "tiny", sample))
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == ["calculator_add"]
    assert model.calls[0]["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    second, third = model.calls[1]["messages"], model.calls[2]["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["content"].startswith("Error: TypeError")  # 2 + "x"
    assert third[-1] == {"role": "tool", "tool_call_id": "call_2", "name": "calculator_add", "content": "5"}
    assert third[-2]["tool_calls"][0]["function"] == {
        "name": "calculator_add",
        "arguments": '{"a": 2, "b": 3}',
    }
    assert result.total_reward == 1.0
    assert result.sample_metrics["correct"] == 1.0 and result.sample_metrics["tool_results"] == 2.0
    assert result.sample_metrics["tool_calls"] == 2.0


def test_a_tool_loop_stops_at_max_turns(registry: Any) -> None:
    env = create_environment(registry, "verifiers", {"taskset": "vf_adder", "max_turns": 2})
    model = ScriptedModel(("calculator_add", '{"a": 1, "b": 1}'), ("calculator_add", '{"a": 1, "b": 1}'))
    result = asyncio.run(env.run(model, "tiny", env.load_dataset()[0]))
    assert len(model.calls) == 2 and result.total_reward == 0.0
    assert result.sample_metrics["tool_results"] == 2.0 and "agent_error" not in result.sample_metrics
