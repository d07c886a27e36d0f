"""openenv: an OpenEnv environment (Meta / Hugging Face: an environment server with reset/step over
HTTP and WebSocket) played by the model as a multi-turn rollout. Install with
``pip install 'telescope-envs[openenv]'`` (tested: openenv-core 0.3.0).

One rollout is one episode on its own WebSocket session: ``reset(seed)`` gives the first observation,
sent to the model as the user message (under the system prompt, if any); each model reply becomes the
action ``{action_field: reply}`` for ``step``; each observation becomes the next user message, until
the environment says ``done`` or the rollout reaches ``max_turns``. The model's calls go through the
run's gateway (``AgentEnvironment``), so every turn is captured in token ids. The reward is the sum of
the rewards the environment returned (a step without one counts 0 and is counted in
``env_reward_missing``). The server is a running one (``url``) or an app started here (``app``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, ClassVar

from telescope.core.env import AgentEnvironment, RewardResult, Sample
from telescope.envs.kwargs import OpenEnvKwargs, load_app

__all__ = ["LocalServer", "OpenEnvEnvironment"]

INSTALL = "pip install 'telescope-envs[openenv]'"
_RESERVED = ("reward", "done", "metadata")


class LocalServer:
    """An ASGI app (an OpenEnv server) served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from telescope.core.weights.group import free_port

        self.port = free_port()
        # critical: openenv-core 0.3.0's server logs every client disconnect as an ASGI exception; a real
        # server failure still reaches the rollout (a failed reset/step: agent_error, counted).
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical")
        )
        self.thread = threading.Thread(target=self.server.run, name="openenv-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        for _ in range(int(timeout_s / 0.05)):
            if self.server.started:
                return
            if not self.thread.is_alive():
                break
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the OpenEnv server did not start on {self.url} within {timeout_s}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class OpenEnvEnvironment(AgentEnvironment):
    """Episodes of an OpenEnv environment, the model's replies as its actions, its rewards summed."""

    kwargs_model: ClassVar[type[OpenEnvKwargs]] = OpenEnvKwargs  # type: ignore[assignment]
    default_name = "openenv"

    def __init__(self, kwargs: OpenEnvKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        kw: OpenEnvKwargs = self.kwargs  # type: ignore[assignment]
        self.url = kw.url
        self.server: LocalServer | None = None

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """One sample per episode: its reset seed (the prompt is the reset observation, known at rollout)."""
        kw: OpenEnvKwargs = self.kwargs  # type: ignore[assignment]
        count = kw.num_samples if num_samples < 0 else min(num_samples, kw.num_samples)
        self._samples = [
            Sample(f"episode seed {kw.seed + i}", "", {"seed": kw.seed + i}) for i in range(count)
        ]
        return self._samples

    async def prepare_resources(self) -> None:
        """Start the local server (``app``), once."""
        kw: OpenEnvKwargs = self.kwargs  # type: ignore[assignment]
        if kw.app is not None and self.server is None:
            self.server = LocalServer(load_app(kw.app))
            await self.server.start()
            self.url = self.server.url

    async def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def render(self, observation: dict[str, Any]) -> str:
        """The observation as the model's next user message."""
        kw: OpenEnvKwargs = self.kwargs  # type: ignore[assignment]
        if kw.observation_field is None:
            shown = {k: v for k, v in observation.items() if k not in _RESERVED}
            return json.dumps(shown, default=str)
        if kw.observation_field not in observation:
            raise KeyError(
                f"observation_field: '{kw.observation_field}' is not in the observation; its fields: "
                f"{', '.join(sorted(observation)) or '(none)'}"
            )
        return str(observation[kw.observation_field])

    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        """One episode: reset, then model reply -> step -> observation until done or max_turns."""
        from openenv.core.generic_client import GenericEnvClient

        kw: OpenEnvKwargs = self.kwargs  # type: ignore[assignment]
        if self.url is None:
            await self.prepare_resources()
        assert self.url is not None
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        total, missing, steps, done = 0.0, 0, 0, False
        async with GenericEnvClient(base_url=self.url, message_timeout_s=kw.step_timeout_s) as env:
            result = await env.reset(seed=sample.metadata["seed"])
            messages.append({"role": "user", "content": self.render(dict(result.observation))})
            while steps < kw.max_turns and not result.done:
                reply = await client.chat.completions.create(model=model, messages=messages)
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                result = await env.step({kw.action_field: text})
                steps += 1
                missing += result.reward is None
                total += float(result.reward or 0.0)
                done = bool(result.done)
                if not done:
                    messages.append({"role": "user", "content": self.render(dict(result.observation))})
        metrics = {
            "env_reward": total,
            "env_steps": float(steps),
            "env_done": float(done),
            "env_reward_missing": float(missing),
        }
        return RewardResult(total, metrics)
