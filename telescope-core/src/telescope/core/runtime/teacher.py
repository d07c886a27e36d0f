"""The run's teacher (on-policy distillation): checked, started as its own pool, closed with the run.

``distill_teacher_base_url`` names a teacher outside the run; otherwise ``distill_teacher_model`` is
served by ``distill_teacher_num_workers`` inference servers of the run's engine, on a placement group
of their own reserved like the policy's (``ray_inference_cpus_per_worker``, the inference GPUs), on
ports claimed like the policy servers'. The teacher's servers never join the weight sync: the teacher
does not learn. Either way its tokenizer must be the policy's (checked before anything starts).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telescope.core.inference.teacher import TeacherClient

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.rollouts.distill import DistillRunner
    from telescope.core.rollouts.rollout import RolloutRunner
    from telescope.core.runtime.session import RunSession

__all__ = ["Teacher", "check_same_tokenizer", "distill_runner", "open_teacher", "teacher_server_config"]

log = logging.getLogger("telescope.distill")


def check_same_tokenizer(cfg: TelescopeConfig, policy_tokenizer: Any) -> None:
    """Refuse a teacher whose vocabulary is not the policy's, naming both (cross-tokenizer distillation
    would compare logprobs of different tokens)."""
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    name = str(cfg.distill_teacher_model)
    try:
        teacher = AutoTokenizer.from_pretrained(resolve_model_path(name))
    except Exception as exc:
        raise ValueError(
            f"distill_teacher_model: cannot load the tokenizer of {name!r} to check it against the policy's "
            f"({cfg.model!r}): {type(exc).__name__}: {exc}; give a local path or a model in the local cache"
        ) from exc
    ours, theirs = policy_tokenizer.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ValueError(
            f"distill_teacher_model {name!r} has another tokenizer than the policy {cfg.model!r} "
            f"({len(theirs)} tokens against {len(ours)}, {differ} entries differ): on-policy distillation "
            "needs the same vocabulary (cross-tokenizer distillation is not supported); pick a teacher "
            "of the policy's family"
        )


def teacher_server_config(cfg: TelescopeConfig, base_port: int, positions: int | None) -> dict[str, Any]:
    """The config the teacher's servers start from: the run's, serving the teacher model on its own
    ports, without LoRA adapters (the teacher is a whole model), one token longer where the teacher's
    ``positions`` allow (a sequence is scored as a prompt, which must leave room for one generated
    token; a rollout that fills a context as long as the teacher's whole window cannot be scored)."""
    longer = cfg.max_model_len + 1
    data = cfg.to_dict()
    data.update(
        model=teacher_location(str(cfg.distill_teacher_model)),
        inference_num_workers=cfg.distill_teacher_num_workers * cfg.inference_tensor_parallel_size,
        inference_base_port=base_port,
        max_model_len=longer if positions is None else min(longer, positions),
        lora_rank=0,
    )
    return data


def teacher_location(name: str) -> str:
    """``name`` as the servers must load it: a folder on this machine as an absolute path (a relative
    one would be looked up from the server process's working directory), anything else unchanged."""
    import os

    return os.path.abspath(name) if os.path.isdir(name) else name


def teacher_positions(name: str) -> int | None:
    """The teacher model's ``max_position_embeddings`` (None when its config does not say)."""
    from transformers import AutoConfig

    from telescope.core.models.tiny import resolve_model_path

    value = getattr(AutoConfig.from_pretrained(resolve_model_path(name)), "max_position_embeddings", None)
    return int(value) if value is not None else None


@dataclass
class Teacher:
    """The client, and what to stop when the run ends (nothing for a teacher outside the run)."""

    client: TeacherClient
    actors: list[Any] = field(default_factory=list)
    placement_group: Any = None
    claims: list[Any] = field(default_factory=list)

    async def close(self) -> None:
        await self.client.close()
        await self.close_pool()

    async def close_pool(self) -> None:
        """Stop the teacher's servers and free their placement and ports (nothing for a remote one)."""
        if self.actors or self.placement_group is not None:
            await asyncio.to_thread(self._stop_pool)
        for held in self.claims:
            held.release()
        self.claims.clear()

    def _stop_pool(self) -> None:
        import ray

        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=30)
        except Exception as exc:  # noqa: BLE001 - continue tearing down
            log.warning("stopping the teacher's servers: %s", exc)
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self.placement_group is not None:
            ray.util.remove_placement_group(self.placement_group)


async def distill_runner(session: RunSession, runner: RolloutRunner) -> DistillRunner:
    """``runner`` with the run's teacher scoring every sample (its pool stops with ``close``)."""
    from telescope.core.rollouts.distill import DistillRunner

    teacher = await open_teacher(session, runner.tokenizer)
    return DistillRunner.around(runner, teacher.client, teacher.close_pool)


async def open_teacher(session: RunSession, policy_tokenizer: Any) -> Teacher:
    """The run's teacher, checked and (for a local one) started and healthy."""
    cfg = session.cfg
    await asyncio.to_thread(check_same_tokenizer, cfg, policy_tokenizer)
    options = {
        "timeout_s": cfg.distill_teacher_timeout_s,
        "max_retries": cfg.distill_teacher_max_retries,
        "batch_size": cfg.distill_teacher_batch_size,
    }
    model = str(cfg.distill_teacher_model)
    if cfg.distill_teacher_base_url is not None:
        return Teacher(TeacherClient.remote(cfg.distill_teacher_base_url, model, **options))
    return await asyncio.to_thread(_start_pool, session, options)


def _start_pool(session: RunSession, options: dict[str, Any]) -> Teacher:
    from ray.util.placement_group import placement_group

    from telescope.core.cluster.claims import port_block
    from telescope.core.cluster.run_secret import auth_headers
    from telescope.core.runtime.cluster import Pools, wait_placed
    from telescope.core.runtime.ray_group import start_servers

    cfg, count = session.cfg, session.cfg.distill_teacher_num_workers
    first, claims = port_block(
        cfg.inference_host or "0.0.0.0",
        cfg.inference_base_port + cfg.num_inference_servers,
        count,
        {"run_dir": str(session.run_dir), "role": "teacher"},
    )
    gpus = float(session.pools.inference_gpus)
    bundle = {"CPU": cfg.ray_inference_cpus_per_worker, **({"GPU": gpus} if gpus else {})}
    pg = placement_group(
        [bundle] * count,
        strategy=cfg.ray_inference_placement_strategy,
        name=f"{cfg.ray_namespace}-teacher-{session.run_id or 'run'}",
    )
    teacher = Teacher(
        TeacherClient([], str(cfg.distill_teacher_model), **options), placement_group=pg, claims=claims
    )
    try:
        wait_placed(
            pg,
            cfg,
            f"the teacher's placement group ({count} x {bundle})",
            "Lower distill_teacher_num_workers or ray_inference_cpus_per_worker, use distill_teacher_base_url",
        )
        servers = start_servers(
            teacher_server_config(cfg, first, teacher_positions(str(cfg.distill_teacher_model))),
            session.plugins,
            Pools(pg, None, gpus, 0.0),
            cfg.inference_engine,
            count,
            cfg.ray_inference_cpus_per_worker,
            str(session.run_dir / "logs" / "teacher"),
        )
    except BaseException:
        teacher._stop_pool()
        for held in claims:
            held.release()
        raise
    teacher.actors = servers.actors
    teacher.client.base_urls = list(servers.urls)
    teacher.client.headers = auth_headers()
    log.info("teacher %s served at %s", cfg.distill_teacher_model, ", ".join(servers.urls))
    return teacher
