"""Wiring one orchestrator: tokenizer, environments, scheduler, clients, weight sync, trainer handle."""

from __future__ import annotations

import asyncio
from typing import Any

from telescope.core.env.chat import ChatOptions
from telescope.core.env.resolve import create_environment
from telescope.core.observe.info import environment_info
from telescope.core.runtime.batching import BatchBuilder
from telescope.core.runtime.healing import RayServerHealer
from telescope.core.runtime.orchestrator import Orchestrator
from telescope.core.runtime.prompts import PromptSource
from telescope.core.runtime.ray_group import RayTrainerGroup, node_free_port
from telescope.core.runtime.rollout import GenerationSettings, RolloutRunner
from telescope.core.runtime.scheduler import PromptScheduler, SourceEnv
from telescope.core.runtime.tokens import Interleaver, stop_token_ids

__all__ = ["add_checkpoints_and_evals", "build_orchestrator", "load_environments", "load_tokenizer"]


def load_tokenizer(cfg: Any) -> Any:
    """The policy's tokenizer (``chat_template`` from the config overrides the tokenizer's own)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def load_environments(cfg: Any, registry: Any) -> dict[str, Any]:
    """Every training environment, built through the registry with its datasets loaded."""
    envs = {}
    for entry in cfg.environments:
        if entry.name in envs:
            raise ValueError(
                f"environments: '{entry.name}' is listed twice; merge the entries (weights add up)"
            )
        env = create_environment(registry, entry.name, entry.kwargs)
        env.reward_min, env.reward_max = entry.reward_min, entry.reward_max
        env.samples()
        envs[entry.name] = env
    return envs


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


def sync_group_spec(cfg: Any, host: str, port: int, world_size: int, backend: str) -> dict[str, Any]:
    """``GroupSpec`` fields of the run's weight-sync group (``ray_broadcast_init_timeout_s`` bounds
    the rendezvous and every collective)."""
    return {"host": host, "port": port, "world_size": world_size, "backend": backend,
            "timeout_s": float(cfg.ray_broadcast_init_timeout_s)}  # fmt: skip


async def init_weight_sync(session: Any, clients: list[Any], ranks_per_server: int = 1) -> None:
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


def inference_engine(cfg: Any, registry: Any) -> Any:
    """The run's engine object (clients and group layout are engine specific; nothing is launched)."""
    return registry.create("inference_engine", cfg.inference_engine, cfg.inference_engine_kwargs, cfg=cfg)


def eval_exclusions(cfg: Any, registry: Any) -> dict[str, frozenset[int]]:
    """Training samples reserved for evals (``separate_eval_samples``)."""
    if not cfg.evals:
        return {}
    from telescope.core.evals import training_exclusions

    return dict(training_exclusions(cfg, registry))


async def build_orchestrator(session: Any, observer: Any, pset: Any) -> tuple[Orchestrator, list[Any]]:
    """The orchestrator for a started session (servers healthy, trainers initialised)."""
    from telescope.core.algorithms import get_algorithm

    cfg, registry = session.cfg, session.registry
    tokenizer = await asyncio.to_thread(load_tokenizer, cfg)
    envs = await asyncio.to_thread(load_environments, cfg, registry)
    _call(observer, "on_info", lambda info: None)({"environments": environment_info(envs, cfg)})
    engine = inference_engine(cfg, registry)
    clients = [engine.client(url) for url in session.servers.urls]
    await init_weight_sync(session, clients, engine.sync_ranks_per_server)
    chat = ChatOptions.from_config(cfg)
    excluded = await asyncio.to_thread(eval_exclusions, cfg, registry)
    sources = [SourceEnv(e.name, e.weight, len(envs[e.name]), excluded.get(e.name, frozenset()))
               for e in cfg.environments]  # fmt: skip
    ranges = {e.name: (e.reward_min, e.reward_max) for e in cfg.environments}
    prefetch = cfg.prompt_prefetch_buffer_size if cfg.enable_prompt_prefetch else 0
    prompts = PromptSource(PromptScheduler(sources, cfg.seed), envs, ranges, tokenizer, chat, prefetch)
    interleaver = Interleaver(tokenizer, chat) if cfg.interleaved_rollouts else None
    runner = RolloutRunner(
        tokenizer, GenerationSettings.from_config(cfg, stop_token_ids(tokenizer)), interleaver
    )
    dp = int(session.trainer_info[0].get("dp_world_size", len(session.trainers)))
    trainer = RayTrainerGroup(session.trainers, dp, clients, session.servers.urls)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = BatchBuilder(cfg, get_algorithm(cfg.algorithm, registry), pad)
    orchestrator = Orchestrator(cfg, prompts, runner, clients, trainer, batches, observer)
    orchestrator.tokenizer = tokenizer
    orchestrator.healer = RayServerHealer(
        session.servers.actors, clients, lambda members: init_weight_sync(session, members, engine.sync_ranks_per_server),
        trainer.excluded,
    )  # fmt: skip
    return orchestrator, clients


async def add_checkpoints_and_evals(orchestrator: Orchestrator, session: Any, observer: Any) -> Any:
    """Resume state, the checkpoint hook and the eval controller; returns the controller (or None)."""
    from telescope.core.runtime.checkpointing import RunCheckpointer
    from telescope.core.runtime.eval_control import EvalController

    cfg, resume, trainer = session.cfg, session.resume, orchestrator.trainer
    assert isinstance(trainer, RayTrainerGroup)
    if resume is not None:
        await trainer.load_checkpoint(str(resume.path))
        orchestrator.load_state_dict(resume.orchestrator_state)
        await orchestrator.sync_weights(resume.step)  # the servers started from the base model
    if cfg.checkpoint_every:
        orchestrator.hooks.append(RunCheckpointer(cfg, trainer, _call(observer, "logger_ids", dict),
                                                  _call(observer, "warn", lambda msg: None)))  # fmt: skip
    if not cfg.evals:
        return None
    from telescope.core.evals import EvalRunner

    runner = await asyncio.to_thread(EvalRunner, cfg, session.registry, orchestrator.tokenizer)
    controller = EvalController(
        cfg, runner, orchestrator.clients, _call(observer, "on_eval", lambda s, r: None)
    )
    orchestrator.hooks.append(controller)
    return controller


def _call(observer: Any, name: str, default: Any) -> Any:
    """An optional observer method (test observers may not have it)."""
    return getattr(observer, name, default)
