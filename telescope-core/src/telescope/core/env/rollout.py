"""A text-level multi-turn rollout driver (for evals, debugging and tests).

The orchestrator runs the token-exact loop; this one follows the same turn semantics
(``env_response`` runs after every generation, then ``is_done`` decides) on plain text,
with any ``respond(messages) -> str`` function standing in for the model.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from telescope.core.env.base import MultiTurnEnvironment
from telescope.core.env.types import ChatMessage, RolloutState, Sample, TrajectoryStep

__all__ = ["Responder", "run_text_rollout"]

Responder = Callable[[list[ChatMessage]], "str | Awaitable[str]"]


async def run_text_rollout(env: MultiTurnEnvironment, sample: Sample, respond: Responder) -> RolloutState:
    """Play one rollout of ``sample``; the loop ends on ``is_done`` (turn limit included)."""
    state = env.create_initial_state(sample)
    messages = env.get_initial_prompt(sample)
    while True:
        reply = respond([dict(m) for m in messages])
        text = await reply if inspect.isawaitable(reply) else reply
        assistant = {"role": "assistant", "content": str(text)}
        state.trajectory.append(TrajectoryStep(prompt=[dict(m) for m in messages], completion=[assistant]))
        env_messages = await env.env_response([*messages, assistant], state)
        done, reason = env.is_done(state)
        if done:
            state.is_completed, state.stop_reason = True, reason
            return state
        messages = env.get_next_prompt_messages(state, env_messages)
