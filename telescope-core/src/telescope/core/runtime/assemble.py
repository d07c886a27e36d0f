"""Wiring one orchestrator: tokenizer, environments, scheduler, clients, weight sync, trainer handle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from telescope.core.env.chat import ChatOptions
from telescope.core.env.resolve import create_environment
from telescope.core.health import HEALTH_PLUGIN
from telescope.core.observe.info import environment_info, eval_info
from telescope.core.rollouts.batching import BatchBuilder
from telescope.core.rollouts.distill import DistillRunner
from telescope.core.rollouts.prompts import PromptSource
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner
from telescope.core.rollouts.routing import Router
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv
from telescope.core.rollouts.tokens import Interleaver, stop_token_ids
from telescope.core.runtime.health_actions import HealthActions
from telescope.core.runtime.orchestrator import Orchestrator
from telescope.core.runtime.ray_group import RayTrainerGroup, node_free_port
from telescope.core.runtime.reporting import report_evals
from telescope.core.runtime.supervision.faults import install_faults
from telescope.core.runtime.supervision.healing import RayServerHealer
from telescope.core.runtime.teacher import distill_runner

if TYPE_CHECKING:
    import pluggy

    from telescope.core.config import TelescopeConfig
    from telescope.core.env.base import Environment
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.plugins import PluginSet
    from telescope.core.registry import Registry
    from telescope.core.runtime.eval_control import EvalController
    from telescope.core.runtime.session import RunSession

__all__ = [
    "add_checkpoints_and_evals",
    "train_session",
    "build_orchestrator",
    "build_router",
    "close_environments",
    "load_environments",
    "load_tokenizer",
    "prepare_environments",
]

log = logging.getLogger("telescope.runtime")


def load_tokenizer(cfg: TelescopeConfig) -> Any:
    """The policy's tokenizer (``chat_template`` from the config overrides the tokenizer's own)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def load_environments(cfg: TelescopeConfig, registry: Registry) -> dict[str, Environment]:
    """Every training environment, built through the registry with its datasets loaded.

    A config ``reward_min``/``reward_max`` overrides the environment's declared range; null keeps it.
    """
    envs = {}
    for entry in cfg.environments:
        if entry.name in envs:
            raise ValueError(
                f"environments: '{entry.name}' is listed twice; merge the entries (weights add up)"
            )
        env = create_environment(registry, entry.name, entry.kwargs)
        if entry.reward_min is not None:
            env.reward_min = entry.reward_min
        if entry.reward_max is not None:
            env.reward_max = entry.reward_max
        env.samples()
        envs[entry.name] = env
    return envs


async def prepare_environments(envs: dict[str, Any]) -> None:
    """``prepare_resources`` of every training environment (sandbox pools, tools) before the first
    dispatch; a failure ends the run naming the environment, instead of scoring 0 later."""
    for i, (name, env) in enumerate(envs.items()):
        try:
            await env.prepare_resources()
        except Exception as exc:
            for started, prepared in list(envs.items())[: i + 1]:  # what already started, this one included
                await _close(started, prepared)
            raise RuntimeError(
                f"environment '{name}': prepare_resources failed: {type(exc).__name__}: {exc} "
                f"(check it without training: telescope env check {name})"
            ) from exc


async def close_environments(orchestrator: Orchestrator) -> None:
    """``close`` of every training environment (at the end of the run, however it ends)."""
    for name, env in orchestrator.prompts.envs.items():
        await _close(name, env)


async def _close(name: str, env: Environment) -> None:
    try:
        await env.close()
    except Exception as exc:  # noqa: BLE001 - one failed close must not hide the others or the run's error
        log.warning("environment '%s': close failed: %s: %s", name, type(exc).__name__, exc)


def sync_group_layout(num_servers: int, ranks_per_server: int) -> tuple[int, list[int]]:
    """``(world_size, first rank of each server)`` of the weight-sync group.

    Rank 0 is the trainer; server ``i`` owns ranks ``1 + i * ranks_per_server`` onwards (a vLLM
    server with tensor parallelism adds one member per TP worker, each joining as its first rank
    plus its TP rank), so no two servers' workers share a rank.
    """
    firsts = [1 + i * ranks_per_server for i in range(num_servers)]
    return 1 + num_servers * ranks_per_server, firsts


def sync_backend(trainer_gpus: float, inference_gpus: float) -> str:
    """NCCL only when both ends hold CUDA tensors; gloo otherwise (NCCL cannot reach a CPU server)."""
    return "nccl" if trainer_gpus > 0 and inference_gpus > 0 else "gloo"


def sync_group_spec(
    cfg: TelescopeConfig, host: str, port: int, world_size: int, backend: str
) -> dict[str, Any]:
    """``GroupSpec`` fields of a new weight-sync group (``ray_broadcast_init_timeout_s`` bounds the
    rendezvous and every collective), under a freshly drawn name (``new_group_name``)."""
    from telescope.core.weights.settings import new_group_name

    return {
        "host": host,
        "port": port,
        "world_size": world_size,
        "backend": backend,
        "group_name": new_group_name(),
        "timeout_s": float(cfg.ray_broadcast_init_timeout_s),
    }


async def init_weight_sync(
    session: RunSession, clients: list[ServerClient], ranks_per_server: int = 1
) -> None:
    """Form the group: trainer rank 0 (sender) + every server's workers (receivers), concurrently."""
    from telescope.core.inference.protocol import WeightSyncInitRequest
    from telescope.core.weights.settings import choose_broadcast_host

    cfg = session.cfg
    trainer_ip = await session.trainers[0].node_ip.remote()
    host = choose_broadcast_host(
        trainer_ip, session.servers.node_ips, cfg.ray_broadcast_prefer_loopback_if_single_node
    )
    world_size, firsts = sync_group_layout(len(clients), ranks_per_server)
    backend = sync_backend(session.pools.trainer_gpus, session.pools.inference_gpus)
    # The store listens on trainer rank 0's node, so that node picks the port (not the driver's).
    port = await asyncio.to_thread(node_free_port, session.pools.trainer, 0)
    spec = sync_group_spec(cfg, host, port, world_size, backend)
    requests = [WeightSyncInitRequest(rank=first, **spec) for first in firsts]
    await asyncio.gather(
        session.trainers[0].init_weight_sync.remote(spec),
        *(c.init_weight_sync(r) for c, r in zip(clients, requests, strict=True)),
    )


def inference_engine(cfg: TelescopeConfig, registry: Registry) -> Any:
    """The run's engine object (clients and group layout are engine specific; nothing is launched)."""
    return registry.create("inference_engine", cfg.inference_engine, cfg.inference_engine_kwargs, cfg=cfg)


def eval_exclusions(cfg: TelescopeConfig, registry: Registry) -> dict[str, frozenset[int]]:
    """Training samples reserved for evals (``separate_eval_samples``)."""
    if not cfg.evals:
        return {}
    from telescope.core.evals import training_exclusions

    return dict(training_exclusions(cfg, registry))


async def start_agent_gateway(cfg: TelescopeConfig, tokenizer: Any, client: ServerClient) -> Any:
    """The gateway of a run's agent environments: in the driver, on loopback, behind the run secret; each
    rollout's calls go to its own lane's server (the capture session names it), ``client`` serves the rest."""
    from telescope.core.cluster.run_secret import ensure_run_secret
    from telescope.core.inference.gateway.app import Gateway, GatewaySettings
    from telescope.core.inference.gateway.serve import start_gateway
    from telescope.core.rollouts.agent import AgentGateway

    settings = GatewaySettings.from_config(cfg, max_tokens=cfg.max_tokens)
    gateway = Gateway(client, tokenizer, settings, secret=ensure_run_secret())
    site, url = await start_gateway(gateway, "127.0.0.1", 0)
    return AgentGateway(url, cfg.model, gateway.capture, site=site)


async def build_router(
    cfg: TelescopeConfig,
    prefix_cache_in_metrics: bool,
    urls: list[str],
    available: Callable[[int], bool],
    hook: pluggy.HookRelay,
) -> Router:
    """The run's router over the servers at ``urls``, with each server's prefix cache in tokens for
    ``sticky_least_loaded`` (recorded as run info ``routing``).

    ``prefix_cache_in_metrics`` (the engine's, e.g. vLLM): each server's KV cache as its ``/metrics``
    says (``cache_config_info``, read by the run's own scraper); a server that does not say is None
    (load alone moves its turns). An engine without (the transformers engine keeps no prefix cache):
    None for every server (the load-only rule). Other policies read no cache size.
    """
    sizes: list[int | None] | None = None
    if cfg.routing_policy == "sticky_least_loaded" and prefix_cache_in_metrics:
        from telescope.core.observe.samplers.prometheus import PrometheusScraper, kv_cache_tokens

        scraper = PrometheusScraper(dict(enumerate(urls)), lambda _sample: None, timeout_s=10.0)
        sizes = []
        for server in range(len(urls)):
            try:
                metrics = (await asyncio.to_thread(scraper.scrape, server))["metrics"]
            except OSError as exc:  # the run goes on: this server's turns move for load alone
                hook.telescope_warning(
                    message=f"routing: the prefix cache size of server {server} ({urls[server]}) could not be "
                    f"read from its /metrics ({exc}); its turns move for load alone"
                )
                metrics = {}
            sizes.append(kv_cache_tokens(metrics))
    hook.telescope_run_info(info={"routing": {"policy": cfg.routing_policy, "cache_tokens": sizes}})
    return Router(len(urls), cfg.routing_policy, cfg.routing_saturation_margin, available, sizes)


async def build_orchestrator(
    session: RunSession, hook: pluggy.HookRelay
) -> tuple[Orchestrator, list[ServerClient]]:
    """The orchestrator for a started session (servers healthy, trainers initialised), reporting
    through ``hook`` (the plugin manager's run hooks)."""
    from telescope.core.algorithms import get_algorithm

    cfg, registry = session.cfg, session.registry
    tokenizer = await asyncio.to_thread(load_tokenizer, cfg)
    envs = await asyncio.to_thread(load_environments, cfg, registry)
    hook.telescope_run_info(info={"environments": environment_info(envs, cfg)})
    await prepare_environments(envs)
    engine = inference_engine(cfg, registry)
    # vLLM's request spans are kept only for the requests the run sends (OtlpReceiver.expect)
    traced = {"on_request": session.traces.expect} if session.traces is not None else {}
    clients: list[ServerClient] = [engine.client(url, **traced) for url in session.servers.urls]
    await init_weight_sync(session, clients, engine.sync_ranks_per_server)
    chat = ChatOptions.from_config(cfg)
    excluded = await asyncio.to_thread(eval_exclusions, cfg, registry)
    sources = [
        SourceEnv(e.name, e.weight, len(envs[e.name]), excluded.get(e.name, frozenset()))
        for e in cfg.environments
    ]
    ranges = {name: (env.reward_min, env.reward_max) for name, env in envs.items()}
    prefetch = cfg.prompt_prefetch_buffer_size if cfg.enable_prompt_prefetch else 0
    prompts = PromptSource(PromptScheduler(sources, cfg.seed), envs, ranges, tokenizer, chat, prefetch)
    interleaver = Interleaver(tokenizer, chat) if cfg.interleaved_rollouts else None
    runner = RolloutRunner(
        tokenizer, GenerationSettings.from_config(cfg, stop_token_ids(tokenizer)), interleaver
    )
    if any(getattr(env, "is_agent", False) for env in envs.values()):
        runner.agent_gateway = await start_agent_gateway(cfg, tokenizer, clients[0])
    if cfg.distill_teacher_model is not None:  # on-policy distillation: the teacher scores every sample
        runner = await distill_runner(session, runner)
    trainer = RayTrainerGroup.from_info(session.trainers, session.trainer_info, clients, session.servers.urls)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = BatchBuilder(cfg, get_algorithm(cfg.algorithm, registry), pad)
    batches.teacher_counts = runner.teacher.counts if isinstance(runner, DistillRunner) else None
    orchestrator = Orchestrator(cfg, prompts, runner, clients, trainer, batches, hook)
    orchestrator.rollouts.trace(session.traces, orchestrator.emit)  # vLLM's request spans
    install_faults(orchestrator)  # only with TELESCOPE_FAULTS set
    router = await build_router(
        cfg, engine.prefix_cache_in_metrics, session.servers.urls, orchestrator.lanes.enabled, hook
    )
    # the orchestrator's clients: with TELESCOPE_FAULTS, the fault seam's wrappers (install_faults)
    orchestrator.runner.route_requests(router, orchestrator.clients)  # each request's server: routing.py
    orchestrator.servers.healer = RayServerHealer(
        session.servers.actors,
        clients,
        lambda members: init_weight_sync(session, members, engine.sync_ranks_per_server),
        trainer.excluded,
    )
    return orchestrator, clients


async def add_checkpoints_and_evals(
    orchestrator: Orchestrator, session: RunSession, logger_ids: Callable[[], dict[str, Any]]
) -> EvalController | None:
    """Resume state, the checkpoint hook and the eval controller; returns the controller (or None).

    ``logger_ids`` returns each logger's run ids (stored in every checkpoint).
    """
    from telescope.core.runtime.checkpointing import RunCheckpointer
    from telescope.core.runtime.eval_control import EvalController

    cfg, resume, trainer, hook = session.cfg, session.resume, orchestrator.trainer, orchestrator.hook
    assert isinstance(trainer, RayTrainerGroup)
    if resume is not None:
        await trainer.load_checkpoint(str(resume.path))
        orchestrator.load_state_dict(resume.orchestrator_state)
        await orchestrator.servers.sync_weights(resume.step)  # the servers started from the base model
    if cfg.checkpoint_every:

        def warn(message: str) -> None:
            hook.telescope_warning(message=message)

        orchestrator.hooks.append(RunCheckpointer(cfg, trainer, logger_ids, warn, session.fail))
    if not cfg.evals:
        return None
    from telescope.core.evals import EvalRunner

    runner = await asyncio.to_thread(
        EvalRunner, cfg, session.registry, orchestrator.runner.tokenizer, None, orchestrator.infra
    )
    evals_info = eval_info({name: ev.loaded.env for name, ev in runner.evals.items()})
    hook.telescope_run_info(info={"evals": evals_info})
    controller = EvalController(
        cfg, runner, orchestrator.clients, lambda step, results: report_evals(hook, step, results)
    )
    orchestrator.hooks.append(controller)
    return controller


async def train_session(session: RunSession, pset: PluginSet) -> None:
    """Build the orchestrator around ``session``'s started processes, run it with its checkpoints and
    evals, and close environments and clients however it ends."""
    orchestrator, clients = await build_orchestrator(session, pset.pm.hook)
    session.orchestrator = orchestrator
    evals = None
    try:
        evals = await add_checkpoints_and_evals(orchestrator, session, session.logger_ids)
        health = pset.pm.get_plugin(HEALTH_PLUGIN)  # the run's sentinel acts after every other step hook
        if health is not None:
            orchestrator.hooks.append(HealthActions(health, session))
        if evals is not None:
            await evals.before_training(resumed=session.resume is not None)
        await orchestrator.run()
        if evals is not None:
            await evals.after_training(orchestrator)
    finally:
        if evals is not None:
            await evals.close()
        await close_environments(orchestrator)
        if orchestrator.runner.agent_gateway is not None:
            await orchestrator.runner.agent_gateway.close()
        if isinstance(orchestrator.runner, DistillRunner):
            await orchestrator.runner.close()
        for client in clients:
            await client.close()
