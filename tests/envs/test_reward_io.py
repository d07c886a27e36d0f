"""What a reward receives and what of its result reaches the rollout records.

The EOS rule: ``compute_reward`` sees a single-turn completion without its stop text. The
runtime passes the text of the stop token that actually ended the completion (any of the run's
stop ids, not only the tokenizer's EOS); multi-turn assistant messages carry no stop text
either; ``strip_stop_text = False`` opts out and receives the raw text.

Records: golden answers, info turns (reward error messages included), sample tags and the
environment's stop reason reach ``RolloutRecord`` (real ``RolloutRunner`` and
``records_from_group``; the inference client is a fake, a boundary).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from telescope.core.env import (
    MultiTurnEnvironment,
    MultiTurnKwargs,
    RewardResult,
    RolloutState,
    Sample,
    SingleTurnEnvironment,
    SingleTurnKwargs,
    info_turn,
)
from telescope.core.inference.client import Completion
from telescope.core.observe.adapters import records_from_group
from telescope.core.observe.rundir.records import RolloutRecord
from telescope.core.rollouts.groups import RolloutGroup
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask

EXAMPLE_SRC = Path(__file__).resolve().parents[2] / "examples" / "third_party_env" / "src"


class _Seen(SingleTurnEnvironment):
    """Records the completion text its reward receives."""

    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q", "REVIR")]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        self.seen.append(completion)
        return RewardResult(float(completion == sample.answer))


class _Raw(_Seen):
    strip_stop_text = False


def test_single_turn_reward_gets_the_text_without_the_stop_text() -> None:
    env, sample = _Seen(), Sample("q", "REVIR")
    assert asyncio.run(env.score("REVIR<|im_end|>", sample, "<|im_end|>")).total_reward == 1.0
    assert asyncio.run(env.score("REVIR<|endoftext|>", sample)).total_reward == 1.0  # the class default
    assert asyncio.run(env.evaluate("REVIR<|im_end|>", sample, "<|im_end|>")).metrics == {}
    raw = _Raw()
    assert asyncio.run(raw.score("REVIR<|im_end|>", sample, "<|im_end|>")).total_reward == 0.0
    assert env.seen == ["REVIR", "REVIR", "REVIR"] and raw.seen == ["REVIR<|im_end|>"]


def test_shipped_example_earns_reward_on_a_correct_answer() -> None:
    sys.path.insert(0, str(EXAMPLE_SRC))
    try:
        from telescope_example_env.env import ShoutReverseEnvironment
        from telescope_example_env.plugin import ShoutReverseKwargs
    finally:
        sys.path.remove(str(EXAMPLE_SRC))
    env = ShoutReverseEnvironment(ShoutReverseKwargs(num_samples=3, seed=1))
    sample = env.load_dataset()[0]
    good = asyncio.run(env.score(f"{sample.answer}<|im_end|>", sample, "<|im_end|>"))
    bad = asyncio.run(env.score(f"{sample.answer.lower()}<|im_end|>", sample, "<|im_end|>"))
    assert (good.total_reward, bad.total_reward) == (1.0, 0.0)


class _Client:
    """Fake inference server (a boundary): replies with fixed token ids."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = list(replies)

    async def complete(self, prompt: list[int], **params: Any) -> list[Completion]:
        ids = self.replies.pop(0)
        return [Completion(0, ids, [0.0] * len(ids), "stop", "", prompt, None)]


def _runner(tokenizer: Any, stop_ids: list[int]) -> RolloutRunner:
    return RolloutRunner(tokenizer, GenerationSettings(1.0, None, 16, 512, stop_ids, False), None)


def test_runtime_strips_whichever_stop_token_ended_the_completion(tiny_tokenizer: Any) -> None:
    tok = tiny_tokenizer
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    answer = tok.encode("REVIR", add_special_tokens=False)
    runner, env = _runner(tok, [im_end, eot]), _Seen()
    for stop in (im_end, eot):  # eot is a stop id but not the tokenizer's eos_token
        task = SampleTask("r", env, Sample("q", "REVIR"), [1, 2], "p", None, None)
        sample = asyncio.run(runner.run(_Client([answer + [stop]]), task, lambda: None))
        assert sample.raw_reward == 1.0 and sample.completion_ids[-1] == stop  # raw ids kept
    assert env.seen == ["REVIR", "REVIR"]


class _Echo(MultiTurnEnvironment):
    kwargs_model: ClassVar[type[MultiTurnKwargs]] = MultiTurnKwargs

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q", "REVIR")]

    async def env_response(self, messages: list[dict[str, Any]], state: RolloutState) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "again"}]

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        return RewardResult(float(state.assistant_texts() == ["REVIR"]))


def test_multi_turn_messages_carry_no_stop_text(tiny_tokenizer: Any) -> None:
    tok = tiny_tokenizer
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    answer = tok.encode("REVIR", add_special_tokens=False)
    env = _Echo(MultiTurnKwargs(max_turns=1))
    task = SampleTask(
        "r", env, Sample("q", "REVIR"), tok.encode("hi", add_special_tokens=False), "p", None, None
    )
    sample = asyncio.run(_runner(tok, [eot]).run(_Client([answer + [eot]]), task, lambda: None))
    assert sample.raw_reward == 1.0 and sample.completion_ids[-1] == eot


class _Detailed(SingleTurnEnvironment):
    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q", "42", {"topic": "algebra"})]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if completion == "boom":
            raise RuntimeError("the checker crashed on 'boom'")
        return RewardResult(
            1.0,
            {"correct": 1.0},
            golden_answers={"correct": sample.answer},
            info_turns=[info_turn("tests", "3 of 3 passed")],
            sample_tags={"topic": sample.metadata["topic"]},
        )


class _Game(MultiTurnEnvironment):
    kwargs_model: ClassVar[type[MultiTurnKwargs]] = MultiTurnKwargs

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("q")]

    async def env_response(self, messages: list[dict[str, Any]], state: RolloutState) -> list[dict[str, Any]]:
        return []

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        return True, "solved"

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        return RewardResult(0.5)


def _record(tokenizer: Any, env: Any, text: str) -> dict[str, Any]:
    task = SampleTask("r", env, env.get_sample(0), [1, 2], "p", None, None)
    ids = tokenizer.encode(text, add_special_tokens=False)
    sample = asyncio.run(_runner(tokenizer, []).run(_Client([ids]), task, lambda: None))
    (record,) = records_from_group(RolloutGroup(0, env.name, 0, [sample]), step=1)
    row = json.loads(json.dumps(record.to_dict()))
    assert RolloutRecord.from_dict(row).to_dict() == row  # the run directory reads it back
    return row


def test_reward_details_and_errors_reach_the_records(tiny_tokenizer: Any) -> None:
    row = _record(tiny_tokenizer, _Detailed(), "42")
    assert row["golden_answers"] == {"correct": "42"} and row["sample_tags"] == {"topic": "algebra"}
    assert [t["info_value"] for t in row["info_turns"]] == ["3 of 3 passed"]
    assert row["env_stop_reason"] is None
    failed = _record(tiny_tokenizer, _Detailed(), "boom")
    assert failed["reward"] == 0.0 and failed["sample_metrics"]["reward_error"] == 1.0
    assert any("the checker crashed on 'boom'" in t["info_value"] for t in failed["info_turns"])


def test_environment_stop_reason_reaches_the_records(tiny_tokenizer: Any) -> None:
    row = _record(tiny_tokenizer, _Game(MultiTurnKwargs(max_turns=3)), "move")
    assert row["env_stop_reason"] == "solved" and row["reward"] == 0.5


def test_runner_decodes_each_token_for_the_token_view_up_to_the_limit(tiny_tokenizer: Any) -> None:
    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    answer = tok.encode("REVIR", add_special_tokens=False) + [im_end]
    settings = GenerationSettings(1.0, None, 16, 512, [im_end], False, token_view_max_tokens=len(answer))
    task = SampleTask("r", _Seen(), Sample("q", "REVIR"), [1, 2], "p", None, None)
    sample = asyncio.run(RolloutRunner(tok, settings, None).run(_Client([answer]), task, lambda: None))
    # each id decoded on its own, by the tokenizer (an independent decode per id)
    assert sample.completion_token_texts == [tok.decode([i]) for i in answer]
    assert "".join(sample.completion_token_texts) == tok.decode(answer)
    (row,) = records_from_group(RolloutGroup(0, "e", 0, [sample]), step=1)
    assert row.completion_logprobs == [0.0] * len(answer)  # the fake server's logprobs
    shorter = GenerationSettings(1.0, None, 16, 512, [im_end], False, token_view_max_tokens=len(answer) - 1)
    sample = asyncio.run(RolloutRunner(tok, shorter, None).run(_Client([answer]), task, lambda: None))
    assert sample.completion_token_texts is None  # longer than the limit: no token view
