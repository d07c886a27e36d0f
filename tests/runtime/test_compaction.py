"""Context compaction of multi-turn rollouts: exact ids, every segment trained once, failures not scored.

The scripted server answers with token ids the tokenizer would never produce for their text (one
id per character, where it merges characters): a compaction that re-tokenized text instead of
reusing the sampled ids would train other ids than the ones sampled, and these tests would see it.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from fakes import FakeClient

from telescope.core.algorithms import get_algorithm
from telescope.core.env import MultiTurnEnvironment, MultiTurnKwargs, RewardResult, Sample
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import ChatMessage, RolloutState
from telescope.core.infra import infra_cause
from telescope.core.rollouts.batching import BatchBuilder
from telescope.core.rollouts.compaction import CompactionFailed, CompactionSettings
from telescope.core.rollouts.groups import RolloutGroup, RolloutSample
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask
from telescope.core.rollouts.tokens import Interleaver, stop_token_ids
from telescope.core.testing import make_config

TURN_TEXT = "the cat sat"
SUMMARY_TEXT = "summary"


class Chatter(MultiTurnEnvironment):
    """Every reply is a long observation, so the context grows by ~50 tokens a turn."""

    kwargs_model: ClassVar[type[MultiTurnKwargs]] = MultiTurnKwargs

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("play")]

    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        return [{"role": "user", "content": "observation " * 8 + str(state.num_turns)}]

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        return RewardResult(float(state.num_turns), {"summaries": float(len(state.summaries))})


def char_ids(tokenizer: Any, text: str) -> list[int]:
    """One id per character: decodes to ``text``, but ``text`` encodes to fewer ids."""
    ids = [tokenizer.encode(c, add_special_tokens=False)[0] for c in text]
    assert tokenizer.encode(text, add_special_tokens=False) != ids  # the premise of these tests
    return ids


class Server(FakeClient):
    """Turns answer ``TURN_TEXT``, summary requests ``SUMMARY_TEXT`` (or ``bad_summaries`` first)."""

    def __init__(self, tokenizer: Any, bad_summaries: list[list[int]] | None = None) -> None:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.turn = [*char_ids(tokenizer, TURN_TEXT), end]
        self.summary = [*char_ids(tokenizer, SUMMARY_TEXT), end]
        self.bad = list(bad_summaries or [])
        self.replies: list[tuple[str, list[int], list[int]]] = []
        """(request id, prompt, reply) of every request, in order."""
        super().__init__(self._reply)

    def _reply(self, prompt: list[int], rid: str) -> list[int]:
        if "-c" in rid:
            reply = self.bad.pop(0) if self.bad else self.summary
        else:
            reply = self.turn
        self.replies.append((rid, prompt, reply))
        return reply


def run(
    tokenizer: Any, server: Server, *, train_summary: bool = True, attempts: int = 2, max_turns: int = 12
) -> RolloutSample:
    compaction = CompactionSettings(
        at_tokens=200, max_per_rollout=2, train_summary=train_summary, attempts=attempts
    )
    settings = GenerationSettings(1.0, None, 16, 700, stop_token_ids(tokenizer), False, 0, compaction)
    runner = RolloutRunner(tokenizer, settings, Interleaver(tokenizer, ChatOptions()))
    env = Chatter(MultiTurnKwargs(max_turns=max_turns))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "play"}], add_generation_prompt=True)
    task = SampleTask(
        "g0-s0-v0", env, env.samples()[0], list(prompt), "play", None, None, server=0, group_id=0
    )
    return asyncio.run(runner.run(server, task, lambda: None))  # type: ignore[arg-type]


def segments_of(sample: RolloutSample) -> list[tuple[list[int], list[int], list[bool], bool]]:
    """(prompt, completion, mask, is summary) of every trained sequence of ``sample``, in order."""
    main = (sample.prompt_ids, sample.completion_ids, [bool(m) for m in sample.loss_mask or []], False)
    return [main, *[(s.prompt_ids, s.completion_ids, s.loss_mask, s.summary) for s in sample.extra_segments]]


def trained_at(
    segment: tuple[list[int], list[int], list[bool], bool], prompt: list[int], reply: list[int]
) -> bool:
    """``reply`` follows ``prompt`` in ``segment`` and every one of its tokens is trained there."""
    seg_prompt, completion, mask, _ = segment
    tokens, start = seg_prompt + completion, len(prompt)
    first = start - len(seg_prompt)  # where the reply starts in the completion
    return (
        first >= 0
        and tokens[:start] == prompt
        and tokens[start : start + len(reply)] == reply
        and all(mask[first : first + len(reply)])
    )


def test_each_sampled_reply_is_trained_exactly_once_in_the_sequence_it_was_sampled_in(tokenizer: Any) -> None:
    server = Server(tokenizer)
    sample = run(tokenizer, server)
    segments = segments_of(sample)
    assert [s[3] for s in segments] == [False, True, False, True, False]  # conversation, summary, ...
    assert sample.sample_metrics["agent/compactions"] == 2.0
    assert sample.sample_metrics["agent/segments_per_rollout"] == 5.0
    assert sample.sample_metrics["agent/context_tokens_max"] == max(len(p) + len(c) for p, c, *_ in segments)
    assert sample.sample_metrics["summaries"] == 2.0 and sample.num_turns == 12
    for rid, prompt, reply in server.replies:  # what the server was sent and what it sampled
        homes = [i for i, seg in enumerate(segments) if trained_at(seg, prompt, reply)]
        assert len(homes) == 1, f"request {rid}: trained in segments {homes}"
        assert segments[homes[0]][3] == ("-c" in rid)  # summaries in their own segments only
    trained = sum(sum(mask) for _, _, mask, _ in segments)
    assert trained == sum(len(reply) for *_, reply in server.replies)  # nothing else, nothing twice
    summary_segment = segments[1]
    assert summary_segment[1] == server.summary  # the sampled ids, not SUMMARY_TEXT tokenized again
    assert [r["prompt"] for r in server.requests] == [p for _, p, _ in server.replies]


def test_the_rollout_continues_from_system_task_and_summary(tokenizer: Any) -> None:
    server = Server(tokenizer)
    sample = run(tokenizer, server)
    restart = sample.extra_segments[1].prompt_ids  # the segment after the first summary
    text = tokenizer.decode(restart)
    assert text.startswith("<|im_start|>user\nplay<|im_end|>")  # the task (this env has no system prompt)
    assert SUMMARY_TEXT in text and text.endswith("<|im_start|>assistant\n")
    assert len(restart) < 200  # back under the threshold
    records = sample.info["segments"]
    assert [r["kind"] for r in records] == [
        "conversation",
        "summary",
        "conversation",
        "summary",
        "conversation",
    ]
    assert records[1]["text"].startswith(SUMMARY_TEXT)


def test_an_untrained_summary_is_masked_and_everything_else_still_trained_once(tokenizer: Any) -> None:
    server = Server(tokenizer)
    sample = run(tokenizer, server, train_summary=False)
    segments = segments_of(sample)
    assert [s[3] for s in segments] == [False, True, False, True, False]
    assert all(not any(mask) for _, _, mask, summary in segments if summary)
    turns = [reply for rid, _, reply in server.replies if "-c" not in rid]
    assert sum(sum(mask) for _, _, mask, _ in segments) == sum(len(r) for r in turns)


def test_a_rejected_summary_is_retried_and_trained_nowhere(tokenizer: Any) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    server = Server(tokenizer, bad_summaries=[[end]])  # an empty summary: unusable
    sample = run(tokenizer, server)
    attempts = [rid for rid, *_ in server.replies if "-c0-" in rid]
    assert attempts == ["g0-s0-v0-c0-a0", "g0-s0-v0-c0-a1"]
    assert sample.sample_metrics["agent/compactions"] == 2.0
    trained = sum(sum(mask) for _, _, mask, _ in segments_of(sample))
    assert trained == sum(len(reply) for *_, reply in server.replies) - 1  # all but the rejected one


def test_a_compaction_that_never_gets_a_usable_summary_ends_the_rollout_unscored(tokenizer: Any) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    server = Server(tokenizer, bad_summaries=[[end], [end]])
    with pytest.raises(CompactionFailed, match="no usable summary in 2 attempts") as failed:
        run(tokenizer, server)
    cause = infra_cause(failed.value)  # an infrastructure outcome: retried, then masked, never scored
    assert cause is not None and cause.cause == "compaction_failed"


def test_every_segment_reaches_the_batch_with_the_rollouts_advantage(tokenizer: Any) -> None:
    cfg = make_config(environments=[{"name": "x"}], seq_len=1024, pad_to_multiple_of=8, group_size=2)
    samples = [run(tokenizer, Server(tokenizer)), run(tokenizer, Server(tokenizer), max_turns=2)]
    samples[1].reward = 0.0  # the short rollout (no compaction) did worse
    group = RolloutGroup(0, "x", 0, samples)
    builder = BatchBuilder(cfg, get_algorithm(cfg.algorithm), 0)
    builder.assign_advantages(group)
    batch = builder.build([group], 1, 0)
    assert batch.metrics["packing/samples"] == 6.0  # 5 segments + 1
    assert batch.metrics["packing/dropped_overlong_samples"] == 0.0
    rows = batch.per_rank[0].micro_batches
    expected = {sum(sum(m) for *_, m, _ in segments_of(s)): s.advantage for s in samples}
    assert samples[0].advantage > 0 > samples[1].advantage
    trained = [(a, m) for row in rows for a, m in zip(row.advantages, row.loss_mask, strict=True) if m]
    assert len(trained) == sum(expected)
    by_sign = {adv > 0: 0 for adv in expected.values()}
    for advantage, _ in trained:
        by_sign[advantage > 0] += 1
    assert by_sign == {adv > 0: n for n, adv in expected.items()}
