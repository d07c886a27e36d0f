"""``telescope env check``: try an environment end to end without training.

Builds it through the registry (kwargs validated as in a run), loads a few samples, renders
their prompts with the run's tokenizer and chat template, calls ``prepare_resources`` (a
sandboxed environment probes its provider there), scores a reference reply (where the
environment has one, ``Environment.reference_completion``) and a junk reply, and closes it. An
agent environment instead runs one agent rollout through ``run_agent`` (the host gives a model to
run it against: ``telescope env check`` serves the built-in tiny model behind a gateway). Each
step is one ``CheckLine``; a failed step says what failed and the lines after it are skipped
when they need its result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from telescope.core.env.agent import AgentEnvironment
from telescope.core.env.base import (
    ConversationEnvironment,
    Environment,
    MultiTurnEnvironment,
    SingleTurnEnvironment,
)
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import RewardResult, Sample

__all__ = ["JUNK_REPLY", "CheckLine", "check_environment"]

JUNK_REPLY = "zzz qqq"
"""A reply no task should reward (above its minimum)."""


@dataclass(frozen=True)
class CheckLine:
    """One step of a check: ``build``, ``samples``, ``prompts``, ``resources``, ``reference``, ``junk``
    (an agent environment: ``agent``), and ``close`` when closing fails."""

    step: str
    ok: bool
    message: str


async def check_environment(
    registry: Any,
    name: str,
    kwargs: dict[str, Any] | None = None,
    *,
    tokenizer: Any,
    chat: ChatOptions | None = None,
    num_samples: int = 3,
    as_eval: bool = False,
    agent_rollout: AgentRollout | None = None,
) -> list[CheckLine]:
    """Check environment (or eval, with ``as_eval``) ``name``; see the module docstring.
    ``agent_rollout(env, sample)`` runs one agent rollout against a model (agent environments)."""
    from telescope.core.env.resolve import create_environment, create_eval

    lines: list[CheckLine] = []
    try:
        env = (create_eval if as_eval else create_environment)(registry, name, kwargs or {})
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        return [_fail("build", exc)]
    kind = (
        "agent" if isinstance(env, AgentEnvironment) else "multi-turn" if env.is_multi_turn else "single-turn"
    )
    lines.append(
        CheckLine(
            "build", True, f"{type(env).__name__} ({kind}), reward range {env.reward_min}..{env.reward_max}"
        )
    )
    try:
        samples = env.load_dataset(num_samples=num_samples)
        if not samples:
            raise ValueError("the dataset is empty")
    except Exception as exc:  # noqa: BLE001
        return [*lines, _fail("samples", exc)]
    lines.append(CheckLine("samples", True, f"{len(samples)} loaded"))
    try:
        lengths = [
            len(tokenizer.encode(_prompt(env, s, tokenizer, chat), add_special_tokens=False)) for s in samples
        ]
    except Exception as exc:  # noqa: BLE001
        return [*lines, _fail("prompts", exc)]
    lines.append(
        CheckLine("prompts", True, f"{len(lengths)} rendered, {min(lengths)}..{max(lengths)} tokens")
    )
    eos = str(getattr(tokenizer, "eos_token", "") or "")
    try:  # the reward may need what prepare_resources starts (a sandbox pool)
        await env.prepare_resources()
        lines.append(CheckLine("resources", True, "prepare_resources succeeded"))
    except Exception as exc:  # noqa: BLE001
        lines.append(_fail("resources", exc))
    try:
        if isinstance(env, AgentEnvironment):
            lines.append(await _agent(env, samples[0], agent_rollout))
        else:
            lines += await _rewards(env, samples[0], eos)
    finally:
        try:
            await env.close()
        except Exception as exc:  # noqa: BLE001
            lines.append(CheckLine("close", False, f"{type(exc).__name__}: {exc}"))
    return lines


AgentRollout = Callable[[AgentEnvironment, Sample], Awaitable[Any]]
"""Runs one rollout of an agent environment against a model; returns its ``RolloutSample``."""


async def _agent(env: AgentEnvironment, sample: Sample, rollout: AgentRollout | None) -> CheckLine:
    if rollout is None:
        return CheckLine("agent", True, "no model to run the agent against (skipped)")
    try:
        done = await rollout(env, sample)
    except Exception as exc:  # noqa: BLE001
        return _fail("agent", exc)
    metrics = done.sample_metrics
    for key in ("agent_error", "agent_timeout"):
        if metrics.get(key):
            text = "; ".join(str(t.get("info_value", "")) for t in done.info.get("info_turns", []))
            return CheckLine("agent", False, f"{key}: {text}")
    sampled = sum(done.loss_mask) if done.loss_mask is not None else len(done.completion_ids)
    return CheckLine(
        "agent",
        True,
        f"{done.num_turns} call(s), {sampled} sampled tokens, reward {done.raw_reward:g}, "
        f"prefix breaks {metrics.get('agent/prefix_breaks', 0):g}",
    )


def _fail(step: str, exc: BaseException) -> CheckLine:
    return CheckLine(step, False, f"{type(exc).__name__}: {exc}")


def _prompt(env: Environment, sample: Sample, tokenizer: Any, chat: ChatOptions | None) -> str:
    if isinstance(env, ConversationEnvironment):
        return env.format_messages(env.get_initial_prompt(sample), tokenizer, chat)
    assert isinstance(env, SingleTurnEnvironment), f"{type(env).__name__} is neither single- nor multi-turn"
    return env.format_prompt(sample, tokenizer, chat)


async def _score(env: Environment, sample: Sample, reply: str, eos: str) -> RewardResult:
    """The reward of ``reply`` (multi-turn: sent at every turn), scored as a run scores it."""
    if isinstance(env, MultiTurnEnvironment):
        from telescope.core.env.rollout import run_text_rollout

        state = await run_text_rollout(env, sample, lambda messages: reply)
        return await env.score(state, sample, eos)
    return await env.score(reply + eos, sample, eos)


def _error(result: RewardResult) -> str | None:
    """The reward's own failure (error or timeout) with its message, if it failed."""
    failed = [k for k in ("reward_error", "reward_timeout") if result.sample_metrics.get(k)]
    if not failed:
        return None
    text = "; ".join(
        str(t.get("info_value", "")) for t in result.info_turns if t.get("info_type") == "stderr"
    )
    return f"{failed[0]}: {text}"


async def _rewards(env: Environment, sample: Sample, eos: str) -> list[CheckLine]:
    lines = []
    junk = await _score(env, sample, JUNK_REPLY, eos)
    reference = env.reference_completion(sample)
    if reference is None:
        lines.append(CheckLine("reference", True, "the environment has no reference answer (skipped)"))
    else:
        good = await _score(env, sample, reference, eos)
        failed = _error(good)
        if failed is not None:
            lines.append(CheckLine("reference", False, f"scoring {reference!r} failed: {failed}"))
        elif good.total_reward <= junk.total_reward:
            lines.append(
                CheckLine(
                    "reference",
                    False,
                    f"the reference answer {reference!r} scored "
                    f"{good.total_reward:g}, no more than a junk answer ({junk.total_reward:g})",
                )
            )
        else:
            lines.append(CheckLine("reference", True, f"{reference!r} scored {good.total_reward:g}"))
    failed = _error(junk)
    junk_line = f"{JUNK_REPLY!r} scored {junk.total_reward:g}"
    lines.append(
        CheckLine("junk", failed is None, junk_line if failed is None else f"scoring failed: {failed}")
    )
    return lines
