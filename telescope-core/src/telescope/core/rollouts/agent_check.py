"""``try_agent``: one agent rollout against a model served in this process (``telescope env check``)."""

from __future__ import annotations

from typing import Any

from telescope.core.env.agent import AgentEnvironment
from telescope.core.rollouts.groups import RolloutSample

__all__ = ["try_agent"]


async def try_agent(
    env: AgentEnvironment, sample: Any, model: str = "telescope/tiny", max_tokens: int = 32
) -> RolloutSample:
    """One rollout of ``env`` on ``sample`` against ``model`` served in this process (the transformers
    engine on CPU) behind a gateway: what ``telescope env check`` runs for an agent environment. The
    gateway takes the run's secret (made here when absent) or the agent's rollout key, nothing else:
    for its duration it is as closed as a run's."""
    import asyncio

    from telescope.core.cluster.run_secret import ensure_run_secret
    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.gateway.app import Gateway, GatewaySettings
    from telescope.core.inference.gateway.serve import start_gateway
    from telescope.core.inference.transformers_engine.server import start_in_thread
    from telescope.core.rollouts.agent import AgentGateway, run_agent_rollout
    from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask
    from telescope.core.rollouts.tokens import stop_token_ids
    from telescope.core.weights.group import free_port

    fields = {"model": model, "max_tokens": max_tokens, "environments": [{"name": "reverse_text"}]}
    cfg = TelescopeConfig.model_validate(fields)  # the environment is a required field, never used
    server = await asyncio.to_thread(start_in_thread, cfg, port=free_port())
    tokenizer = server.state.tokenizer
    try:
        async with InferenceClient(server.url) as engine:
            settings = GatewaySettings.from_config(cfg, max_tokens=max_tokens)
            gateway = Gateway(engine, tokenizer, settings, secret=ensure_run_secret())
            site, url = await start_gateway(gateway)
            try:
                runner = RolloutRunner(
                    tokenizer, GenerationSettings.from_config(cfg, stop_token_ids(tokenizer)), None
                )
                runner.agent_gateway = AgentGateway(url, cfg.model, gateway.capture)
                task = SampleTask("env-check", env, sample, [], str(sample.prompt), None, None)
                return await run_agent_rollout(runner, runner.agent_gateway, engine, task, lambda: None)
            finally:
                await site.cleanup()
    finally:
        await asyncio.to_thread(server.stop)
