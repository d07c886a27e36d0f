"""A demo OpenEnv environment, written per OpenEnv's template (Action, Observation, Environment,
create_app): reverse the word the environment shows, in two tries; each try's reward is the fraction of
the reversed word's characters in the reply. ``telescope env check openenv`` and the tests play it:
``{app: telescope.envs.openenv_demo:app, observation_field: text}``. Needs openenv-core."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ["abc", "dog", "fox", "cat", "sun", "pen"]


class ReverseAction(Action):
    message: str = Field(..., description="The reversed word")


class ReverseObservation(Observation):
    text: str = Field(default="", description="What the environment says")


def overlap(reply: str, answer: str) -> float:
    return sum(c in reply for c in answer) / len(answer)


class ReverseEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True
    TRIES = 2

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.word = WORDS[0]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ReverseObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.word = WORDS[(seed or 0) % len(WORDS)]
        return ReverseObservation(text=f"reverse: {self.word}", done=False, reward=None)

    def step(
        self, action: ReverseAction, timeout_s: float | None = None, **kwargs: Any
    ) -> ReverseObservation:  # type: ignore[override]
        self._state.step_count += 1
        reward = overlap(action.message, self.word[::-1])
        done = reward == 1.0 or self._state.step_count >= self.TRIES
        return ReverseObservation(text="try again" if not done else "", done=done, reward=reward)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    ReverseEnvironment,
    ReverseAction,
    ReverseObservation,
    env_name="telescope_reverse",
    max_concurrent_envs=64,
)
