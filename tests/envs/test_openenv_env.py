"""The openenv environment against a real OpenEnv server (openenv-core; telescope.envs.openenv_demo,
written per its template) started locally. The model is a scripted stand-in for the gateway's openai
client here (the boundary); tests/runtime/test_openenv_run.py plays it with the real gateway."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from telescope.core.env.resolve import create_environment
from telescope.envs.kwargs import OpenEnvKwargs

pytest.importorskip("openenv.core")


class ScriptedModel:
    """Stand-in for ``openai.AsyncOpenAI`` (``client.chat.completions.create``): replies from a script and
    keeps the messages of every call."""

    def __init__(self, *replies: str) -> None:
        self.replies = iter(replies)
        self.calls: list[list[dict[str, Any]]] = []
        self.chat = self.completions = self

    async def create(self, *, model: str, messages: list[dict[str, Any]]) -> Any:
        self.calls.append([dict(m) for m in messages])
        message = SimpleNamespace(content=next(self.replies))
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def episode(registry: Any, model: ScriptedModel, seed: int = 1, **kwargs: Any) -> Any:
    env = create_environment(
        registry, "openenv", {"app": "telescope.envs.openenv_demo:app", "observation_field": "text", **kwargs}
    )

    async def go() -> Any:
        await env.prepare_resources()
        try:
            sample = next(s for s in env.load_dataset() if s.metadata["seed"] == seed)
            return await env.run(model, "tiny", sample)
        finally:
            await env.close()

    return asyncio.run(go())


def test_an_episode_sums_the_environments_rewards(registry: Any) -> None:
    model = ScriptedModel("gxd", "god")  # seed 1 shows "dog": overlap 2/3, then solved
    result = episode(registry, model, system_prompt="Play.")
    assert result.total_reward == pytest.approx(2 / 3 + 1.0)
    assert result.sample_metrics == {
        "env_reward": pytest.approx(5 / 3),
        "env_steps": 2.0,
        "env_done": 1.0,
        "env_reward_missing": 0.0,
    }
    assert model.calls[0] == [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "reverse: dog"},
    ]
    assert model.calls[1][2:] == [
        {"role": "assistant", "content": "gxd"},
        {"role": "user", "content": "try again"},
    ]


def test_done_ends_the_episode_and_max_turns_caps_it(registry: Any) -> None:
    solved = ScriptedModel("god", "never sent")
    assert episode(registry, solved).sample_metrics["env_steps"] == 1.0 and len(solved.calls) == 1
    capped = ScriptedModel("x")
    result = episode(registry, capped, max_turns=1)
    assert result.sample_metrics["env_steps"] == 1.0 and result.sample_metrics["env_done"] == 0.0


def test_the_whole_observation_is_sent_without_a_field(registry: Any) -> None:
    model = ScriptedModel("god")
    episode(registry, model, observation_field=None)
    assert model.calls[0][-1] == {"role": "user", "content": '{"text": "reverse: dog"}'}


def test_a_missing_observation_field_or_server_scores_zero_and_is_counted(registry: Any) -> None:
    result = episode(registry, ScriptedModel("god"), observation_field="board")
    assert result.total_reward == 0.0 and result.sample_metrics["agent_error"] == 1.0
    assert (
        "observation_field: 'board' is not in the observation; its fields:"
        in result.info_turns[0]["info_value"]
    )
    env = create_environment(registry, "openenv", {"url": "http://127.0.0.1:9"})
    down = asyncio.run(env.run(ScriptedModel("x"), "tiny", env.load_dataset()[0]))
    assert down.sample_metrics["agent_error"] == 1.0 and "ConnectionError" in down.info_turns[0]["info_value"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "set exactly one of url (a running OpenEnv server) and app"),
        ({"url": "http://x", "app": "m:a"}, "set exactly one of url"),
        ({"app": "oe_reverse"}, "app: 'oe_reverse' must be module:attribute"),
    ],
)
def test_bad_kwargs_name_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OpenEnvKwargs(**kwargs)


def test_config_validate_imports_the_app(registry: Any) -> None:
    from telescope.core.env.resolve import environment_component_problems

    component = registry.get("environment", "openenv")
    assert (
        environment_component_problems(component, {"app": "telescope.envs.openenv_demo:app"}, registry) == []
    )
    (problem,) = environment_component_problems(
        component, {"app": "telescope.envs.openenv_demo:ap"}, registry
    )
    assert problem == (
        "app: 'telescope.envs.openenv_demo:ap' does not import: AttributeError: app: module "
        "'telescope.envs.openenv_demo' has no 'ap'"
    )
