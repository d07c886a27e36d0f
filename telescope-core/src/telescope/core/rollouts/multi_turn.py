"""One multi-turn rollout in exact token ids: the environment answers each model turn.

The next prompt reuses the exact token ids so far (``Interleaver``, or a re-render kept only when
it extends them), and environment tokens are masked out of the loss. Reaching the context limit
ends a rollout gracefully (it is scored as it stands), never with an error; with
``context_compaction_at_tokens`` set, the policy summarizes and the rollout continues
(``rollouts/compaction.py``: the segments, their ids and masks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.env.chat import render_messages
from telescope.core.env.types import ChatMessage, RolloutState, TrajectoryStep
from telescope.core.rollouts.compaction import (
    Conversation,
    compaction_failed,
    segment_records,
    summary_segment,
)
from telescope.core.rollouts.seeds import request_seed, turn_seed
from telescope.core.rollouts.tokens import strip_stop

if TYPE_CHECKING:
    from telescope.core.env.base import MultiTurnEnvironment
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.rollouts.compaction import CompactionSettings
    from telescope.core.rollouts.groups import RolloutSample

__all__ = ["run_multi_turn"]


@dataclass(frozen=True)
class TurnIds:
    """One turn's token ids: its prompt and what the policy sampled."""

    prompt: list[int]
    completion: list[int]
    index: int


async def run_multi_turn(
    runner: Any,
    client: ServerClient,
    task: Any,
    env: MultiTurnEnvironment,
    on_generated: Callable[[], None],
) -> RolloutSample:
    """Play and score one rollout of ``task`` (a ``rollout.SampleTask``) with ``runner`` (the
    ``rollout.RolloutRunner``, which calls this: typed loosely so the two modules do not import each
    other); raises ``CompactionFailed``, an infrastructure failure, when a needed summary fails."""
    state = env.create_initial_state(task.sample)
    initial = env.get_initial_prompt(task.sample)
    messages = initial
    start_version, t0 = task.model_version(), time.time()
    conversation = Conversation.start(task.prompt_ids)
    finish = "stop"
    response_ids: list[str] = []
    for turn in range(env.max_turns):
        prompt_ids = conversation.tokens
        params = runner.request_params(
            len(prompt_ids), turn, f"{task.request_id}-t{turn}", turn_seed(task.seed, turn)
        )
        if params is None:
            state.stop_reason, finish = "context_exhausted", "length"
            break
        choice = await runner.complete(client, task, prompt_ids, params)
        response_ids += [choice.response_id] if choice.response_id else []
        ids = list(choice.token_ids)
        conversation.sampled(ids, list(choice.logprobs))
        finish = choice.finish_reason or "stop"
        assistant = {"role": "assistant", "content": strip_stop(runner.decode(ids), runner.stop_text(ids))}
        state.trajectory.append(
            TrajectoryStep(
                prompt=[dict(m) for m in messages],
                completion=[assistant],
                prompt_token_ids=list(prompt_ids),
                completion_token_ids=ids,
                completion_logprobs=list(choice.logprobs),
                is_truncated=finish == "length",
            )
        )
        env_messages = await env.env_response([*messages, assistant], state)
        done, reason = env.is_done(state)
        if done:
            state.is_completed, state.stop_reason = True, reason
            break
        messages = env.get_next_prompt_messages(state, env_messages)
        env_ids = env_tokens(runner, ids, messages, env_messages, prompt_ids)
        if env_ids is None:
            state.stop_reason = "retokenization_mismatch"
            break
        if compaction_due(runner.settings.compaction, conversation, env_ids):
            latest = TurnIds(prompt_ids, ids, turn)
            messages = await compact(
                runner, client, task, env, state, conversation, latest, messages, env_messages, initial
            )
            continue
        conversation.glue(env_ids)
    t1 = time.time()
    on_generated()
    result = await env.score(state, task.sample, runner.eos_text)
    return _sample(
        runner, task, state, conversation, result, finish, start_version, (t0, t1, time.time()), response_ids
    )


def _sample(
    runner: Any,
    task: Any,
    state: RolloutState,
    conversation: Conversation,
    result: Any,
    finish: str,
    start_version: int,
    times: tuple[float, float, float],
    response_ids: list[str],
) -> RolloutSample:
    """The scored rollout: its first segment as the sample's sequence, the others beside it."""
    texts = "".join(str(m.get("content", "")) for s in state.trajectory for m in s.completion)  # type: ignore[union-attr]
    segments = conversation.segments()
    main = segments[0]
    mask = [int(m) for m in main.loss_mask]
    sample = runner._finish(
        task,
        main.completion_ids,
        main.logprobs,
        mask,
        finish,
        result,
        texts,
        start_version,
        times,
        num_turns=state.num_turns,
    )
    sample.info["stop_reason"] = state.stop_reason
    sample.response_ids = response_ids
    if runner.settings.compaction is not None:
        sample.sample_metrics.update(conversation.metrics())
    if len(segments) > 1:
        sample.extra_segments = segments[1:]
        sample.info["segments"] = segment_records(
            segments, [runner.decode(s.completion_ids) for s in segments]
        )
    return sample


def compaction_due(
    settings: CompactionSettings | None, conversation: Conversation, env_ids: list[int]
) -> bool:
    """The next prompt would pass ``context_compaction_at_tokens`` and compactions are left."""
    return (
        settings is not None
        and conversation.compactions < settings.max_per_rollout
        and len(conversation.tokens) + len(env_ids) > settings.at_tokens
    )


async def compact(
    runner: Any,
    client: ServerClient,
    task: Any,
    env: MultiTurnEnvironment,
    state: RolloutState,
    conversation: Conversation,
    turn: TurnIds,
    messages: list[ChatMessage],
    env_messages: list[ChatMessage],
    initial: list[ChatMessage],
) -> list[ChatMessage]:
    """Ask the policy for a summary (``context_compaction_attempts`` tries), record the segments, and
    return the messages the rollout continues from; raises ``CompactionFailed`` when none is usable."""
    settings = runner.settings.compaction
    assert settings is not None
    compactor = env.compactor()
    request = compactor.request(state)
    request_ids = env_tokens(
        runner, turn.completion, [*messages, *request], [*env_messages, *request], turn.prompt
    )
    if request_ids is None:
        raise compaction_failed(
            "the chat template renders the conversation differently once the summary request is added"
        )
    prompt = conversation.tokens + request_ids
    index = conversation.compactions
    for attempt in range(settings.attempts):
        seed = None if task.seed is None else request_seed(task.seed, "compaction", index, attempt)
        params = runner.request_params(
            len(prompt), turn.index, f"{task.request_id}-c{index}-a{attempt}", seed
        )
        if params is None:
            raise compaction_failed(
                f"no room to ask for a summary: the conversation and the request take {len(prompt)} tokens "
                f"of max_model_len={runner.settings.max_model_len}; lower context_compaction_at_tokens"
            )
        choice = await runner.complete(client, task, prompt, params)
        ids = list(choice.token_ids)
        summary = compactor.summary(
            strip_stop(runner.decode(ids), runner.stop_text(ids)), choice.finish_reason == "length", state
        )
        if summary is not None:
            break
    else:
        raise compaction_failed(
            f"compaction {index + 1} of rollout {task.request_id}: no usable summary in {settings.attempts} "
            f"attempts (the last: {len(ids)} tokens, finish reason {choice.finish_reason!r}); raise max_tokens "
            "or context_compaction_attempts, or give the environment a compactor it can satisfy"
        )
    restart = compactor.restart(initial, summary, env_messages, state)
    chat = runner.interleaver.chat if runner.interleaver is not None else None
    restart_ids = runner.tokenizer.encode(
        render_messages(runner.tokenizer, restart, chat), add_special_tokens=False
    )
    conversation.compacted(
        summary_segment(prompt, ids, list(choice.logprobs), settings.train_summary), list(restart_ids)
    )
    state.summaries.append(summary)
    return restart


def env_tokens(
    runner: Any,
    ids: list[int],
    messages: list[ChatMessage],
    env_messages: list[ChatMessage],
    prompt_ids: list[int],
) -> list[int] | None:
    """Token ids between this completion and the next generation (bridge + environment turn)."""
    if runner.interleaver is not None:
        return runner.interleaver.bridge(ids) + runner.interleaver.env_ids(env_messages)
    # Non-interleaved: re-render the whole conversation; keep it only if it extends the
    # exact tokens so far (otherwise the trained sequence would not be what the model saw).
    full = runner.tokenizer.encode(render_messages(runner.tokenizer, messages), add_special_tokens=False)
    seen = prompt_ids + ids
    return list(full[len(seen) :]) if list(full[: len(seen)]) == seen else None
