"""``telescope env check`` runs one rollout of an agent environment against the built-in tiny model."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from telescope.cli.commands.envs import app

PLUGIN = """
from telescope.core import hookimpl
from telescope.core.env import AgentEnvironment, AgentKwargs, RewardResult, Sample


class TwoCalls(AgentEnvironment):
    def load_dataset(self, num_samples=-1):
        return [Sample("reverse: abc", "cba")]

    async def run_agent(self, client, model, sample):
        messages = [{"role": "user", "content": sample.prompt}]
        for _ in range(2):
            reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "again"}]
        return RewardResult(0.5)


class Broken(TwoCalls):
    async def run_agent(self, client, model, sample):
        raise KeyError("missing tool")


@hookimpl
def telescope_register_environments(register):
    register.add("two_calls", "agent_checked:TwoCalls", kwargs_model=AgentKwargs, description="agent")
    register.add("broken_agent", "agent_checked:Broken", kwargs_model=AgentKwargs, description="agent")
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_path: str) -> str:
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "agent_checked.py"
    path.write_text(PLUGIN)
    yield str(path)
    sys.modules.pop("agent_checked", None)


def test_an_agent_is_run_and_its_failure_is_one_line(plugin: str) -> None:
    ok = CliRunner().invoke(app, ["check", "two_calls", "-p", plugin])
    assert ok.exit_code == 0, ok.output
    assert "TwoCalls (agent)" in ok.output
    line = re.search(
        r"ok   agent     2 call\(s\), (\d+) sampled tokens, reward 0.5, prefix breaks 0", ok.output
    )
    assert line is not None and 2 <= int(line.group(1)) <= 8, ok.output  # max_tokens 4 per call
    bad = CliRunner().invoke(app, ["check", "broken_agent", "-p", plugin])
    assert bad.exit_code == 1
    assert "FAIL agent     agent_error: KeyError: 'missing tool'" in bad.output
