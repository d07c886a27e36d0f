"""Ray start-up and placement: connect or start a local cluster, reserve the worker pools.

Every Ray field of the run config takes effect here (or is rejected with a clear error).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from telescope.core.config import ConfigError, TelescopeConfig
from telescope.core.runtime import faults

__all__ = ["Pools", "connect", "reserve_pools", "shutdown"]

log = logging.getLogger("telescope.runtime")

_EXCLUDES = ["checkpoints*", "converted*", "*.safetensors", "*.pt", "*.bin", ".git", "__pycache__", "*.pyc",
             "logs", "wandb", "runs", ".venv"]  # fmt: skip


def runtime_env(cfg: TelescopeConfig, run_dir: str) -> dict[str, Any]:
    """The Ray runtime environment: the user's, plus interpreter, venv and run-dir propagation."""
    env: dict[str, Any] = dict(cfg.ray_runtime_env or {})
    env_vars = dict(env.get("env_vars", {}))
    if cfg.ray_propagate_active_venv and os.environ.get("VIRTUAL_ENV"):
        env_vars.setdefault("VIRTUAL_ENV", os.environ["VIRTUAL_ENV"])
    if cfg.ray_propagate_run_dir:
        env_vars.setdefault("TELESCOPE_RUN_DIR", run_dir)
    env_vars.setdefault("TOKENIZERS_PARALLELISM", "false")
    faults.propagate(env_vars)
    if env_vars:
        env["env_vars"] = env_vars
    if cfg.ray_pin_py_executable:
        env.setdefault("py_executable", sys.executable)
    if "working_dir" in env:
        env.setdefault("excludes", _EXCLUDES)
    return env


def connect(cfg: TelescopeConfig, run_dir: str) -> dict[str, Any]:
    """Join ``ray_address`` or, when none answers and ``ray_auto_start_local``, start a local cluster."""
    import ray

    if cfg.ray_disable_runtime_env_hook:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    options: dict[str, Any] = {
        "namespace": cfg.ray_namespace,
        "log_to_driver": cfg.ray_log_to_driver,
        "include_dashboard": False,
        "runtime_env": runtime_env(cfg, run_dir),
        "ignore_reinit_error": True,
    }
    address = cfg.ray_address
    started_here = True
    if address == "local":
        ray.init(address="local", **options)
    else:
        try:
            ray.init(address=address, **options)
            started_here = False
        except ConnectionError as exc:
            if not cfg.ray_auto_start_local:
                raise ConfigError(
                    f"ray_address: no Ray cluster answers at {address!r} ({exc}); start one with "
                    "`ray start --head`, or set ray_auto_start_local: true"
                ) from None
            log.info("no Ray cluster at %s: starting a local one", address)
            ray.init(address="local", **options)
    return {"resources": ray.cluster_resources(), "node_ip": ray.util.get_node_ip_address(),
            "started_here": started_here}  # fmt: skip


@dataclass
class Pools:
    """Placement groups of the two worker pools."""

    inference: Any
    trainer: Any
    inference_gpus: float
    trainer_gpus: float


def reserve_pools(cfg: TelescopeConfig, num_servers: int, use_gpus: bool) -> Pools:
    """One bundle per inference server and per trainer rank, with the configured strategies."""
    import ray
    from ray.util.placement_group import placement_group

    inf_gpus = float(cfg.inference_tensor_parallel_size) if use_gpus else 0.0
    tr_gpus = 1.0 if use_gpus else 0.0
    inf = placement_group(
        [_bundle(cfg.ray_inference_cpus_per_worker, inf_gpus)] * num_servers,
        strategy=cfg.ray_inference_placement_strategy,
        name=f"{cfg.ray_namespace}-inference",
    )
    tr = placement_group(
        [_bundle(cfg.ray_trainer_cpus_per_worker, tr_gpus)] * cfg.trainer_num_workers,
        strategy=cfg.ray_trainer_placement_strategy,
        name=f"{cfg.ray_namespace}-trainer",
    )
    for name, pg in (("inference", inf), ("trainer", tr)):
        try:
            ray.get(pg.ready(), timeout=cfg.ray_placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the {name} placement group could not be placed within ray_placement_timeout_s="
                f"{cfg.ray_placement_timeout_s}s; cluster resources: {ray.cluster_resources()}. Lower "
                f"ray_{name}_cpus_per_worker / the worker counts, or add nodes"
            ) from None
    return Pools(inf, tr, inf_gpus, tr_gpus)


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}


def scheduling(pg: Any, index: int) -> Any:
    """Pin an actor to bundle ``index`` of ``pg`` (child tasks stay in the group)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
    )


def shutdown(cfg: TelescopeConfig, pools: Pools | None, *, started_here: bool = True) -> None:
    """Remove the placement groups and disconnect (which stops a cluster this run started).

    A cluster that was already running is left alone unless ``ray_shutdown_on_exit`` is set:
    then ``ray stop`` ends the Ray processes on this node.
    """
    import ray

    if not ray.is_initialized():
        return
    if pools is not None:
        from ray.util.placement_group import remove_placement_group

        for pg in (pools.inference, pools.trainer):
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
    ray.shutdown()
    if cfg.ray_shutdown_on_exit and not started_here:
        import subprocess

        log.info("ray_shutdown_on_exit: stopping the Ray cluster processes on this node (ray stop)")
        subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "stop"], check=False, capture_output=True
        )
