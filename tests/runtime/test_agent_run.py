"""An agent written only against ``openai.AsyncOpenAI`` trains in a real run (Ray, the transformers
engine, FSDP): its calls are captured through the run's gateway and trained."""

from __future__ import annotations

from pathlib import Path

import pytest
from rundriver import train_to_end

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")

AGENT_PLUGIN = """
from telescope.core import hookimpl
from telescope.core.env import AgentEnvironment, AgentKwargs, RewardResult, Sample

WORDS = ["abc", "dog", "fox", "cat", "sun", "pen"]


class ToolAgent(AgentEnvironment):
    kwargs_model = AgentKwargs

    def load_dataset(self, num_samples=-1):
        self._samples = [Sample(f"reverse: {w}", w[::-1]) for w in WORDS]
        return self._samples

    async def run_agent(self, client, model, sample):
        messages = [{"role": "user", "content": sample.prompt}]
        first = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        messages.append({"role": "assistant", "content": first.choices[0].message.content or ""})
        messages.append({"role": "tool", "tool_call_id": "c0", "content": "checked"})
        second = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        text = second.choices[0].message.content or ""
        return RewardResult(sum(c in text for c in sample.answer) / len(sample.answer))


@hookimpl
def telescope_register_environments(register):
    register.add("tool_agent", "agent_env:ToolAgent", kwargs_model=AgentKwargs, description="agent")
"""


@pytest.mark.slow
def test_an_openai_agent_trains_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "agent_env.py").write_text(AGENT_PLUGIN)
    run_dir = train_to_end(
        tmp_path,
        environments=[{"name": "tool_agent", "kwargs": {"max_turns": 4}}],
        plugins=["agent_env.py"],
        max_tokens=6,
    )
    reader = RunDirReader(run_dir)
    rows = reader.rollouts()
    assert rows, "no rollout records"
    for row in rows:
        assert row["num_turns"] == 2
        assert row["sample_metrics"]["agent/calls"] == 2.0
        assert row["sample_metrics"]["agent/prefix_breaks"] == 0.0  # the chat turns joined one sequence
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) > 0
    kl = [
        v
        for k in reader.steps()[0]["metrics"]
        if "kl_divergence_inference" in k
        for v in [reader.steps()[0]["metrics"][k]]
    ]
    assert kl and all(abs(v) < 1e-3 for v in kl), reader.steps()[0]["metrics"]
