"""``telescope env check``'s gateway (``rollouts.agent_check.try_agent``) takes only its own agent's
calls: before, it ran with no secret, so for its duration anyone local, or a rebinding web page,
could call the model through it."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from telescope.core.env import AgentEnvironment, RewardResult, Sample
from telescope.core.rollouts.agent_check import try_agent


def outsider_status(base_url: str, model: str, headers: dict[str, str]) -> int:
    """What a local process that is not the agent gets from the gateway's chat route."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class Probing(AgentEnvironment):
    """An agent that, mid-rollout, lets outsiders try the gateway, then makes its own call."""

    def __init__(self) -> None:
        super().__init__()
        self.outsiders: list[int] = []

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("reverse: abc", "cba")]

    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        url = str(client.base_url)
        for headers in ({}, {"Authorization": "Bearer not-the-secret"}):
            self.outsiders.append(await asyncio.to_thread(outsider_status, url, model, headers))
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": sample.prompt}], max_tokens=2
        )
        return RewardResult(float(bool(reply.choices)))


def test_the_env_check_gateway_refuses_callers_without_the_secret(tiny_path: str) -> None:
    env = Probing()
    sample = env.load_dataset()[0]
    result = asyncio.run(try_agent(env, sample, model=tiny_path, max_tokens=2))
    assert env.outsiders == [401, 401]
    assert result.reward == 1.0  # the agent's own key still works
