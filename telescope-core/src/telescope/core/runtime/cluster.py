"""Ray start-up and placement: connect or start a local cluster, reserve the worker pools.

Every Ray field of the run config takes effect here (or is rejected with a clear error).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from telescope.core import faults
from telescope.core.config import ConfigError, TelescopeConfig

__all__ = [
    "Pools",
    "connect",
    "private_temp_dir",
    "reserve_pools",
    "shutdown",
    "starts_private_cluster",
    "wait_placed",
]

log = logging.getLogger("telescope.runtime")

_EXCLUDES = [
    "checkpoints*",
    "converted*",
    "*.safetensors",
    "*.pt",
    "*.bin",
    ".git",
    "__pycache__",
    "*.pyc",
    "logs",
    "wandb",
    "runs",
    ".venv",
]


def runtime_env(cfg: TelescopeConfig, run_dir: str, secret_ref: str = "") -> dict[str, Any]:
    """The Ray runtime environment: the user's, plus interpreter, venv and run-dir propagation, and the
    way to the run's secret (``cluster.run_secret``): only the name it has in the cluster's key-value
    store and the worker setup hook that reads it. Never the secret itself: Ray writes the
    ``runtime_env`` in clear to its logs."""
    from telescope.core.cluster import run_secret

    env: dict[str, Any] = dict(cfg.ray_runtime_env or {})
    env_vars = dict(env.get("env_vars", {}))
    env_vars.pop(run_secret.ENV_VAR, None)  # the hook sets the run's own
    if secret_ref:
        env_vars[run_secret.RAY_REF_ENV_VAR] = secret_ref
        user_hook = env.pop("worker_process_setup_hook", None)
        if user_hook is not None:
            if not isinstance(user_hook, str):
                raise ConfigError(
                    f"ray_runtime_env.worker_process_setup_hook: {user_hook!r} is not a 'module.function' "
                    "path; give the hook as a dotted path (Telescope runs it after its own)"
                )
            env_vars[run_secret.RAY_USER_HOOK_ENV_VAR] = user_hook
        env["worker_process_setup_hook"] = run_secret.RAY_SETUP_HOOK
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

    from telescope.core.cluster import run_secret

    if cfg.ray_disable_runtime_env_hook:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
    secret_ref = run_secret.new_ray_ref()
    options: dict[str, Any] = {
        "namespace": cfg.ray_namespace,
        "log_to_driver": cfg.ray_log_to_driver,
        "include_dashboard": False,
        "runtime_env": runtime_env(cfg, run_dir, secret_ref),
        "ignore_reinit_error": True,
    }
    address = _resolve_auto(cfg.ray_address)
    started_here = True
    if address == "local" and cfg.ray_address != "local" and not cfg.ray_auto_start_local:
        raise ConfigError(
            "ray_address: auto found no Ray cluster started with `ray start` to join; start one with "
            "`ray start --head`, give its address, or set ray_auto_start_local: true"
        )
    if address == "local":
        _start_private(options)
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
            _start_private(options)
        if not started_here and _joined_another_runs_cluster(address):
            ray.shutdown()
            _start_private(options)
            started_here = True
    run_secret.publish_to_ray(secret_ref, run_secret.ensure_run_secret())  # the workers wait for it
    claim = _claim_private(run_dir) if started_here else None
    return {
        "resources": ray.cluster_resources(),
        "node_ip": ray.util.get_node_ip_address(),
        "started_here": started_here,
        "private_claim": claim,
    }


def starts_private_cluster(cfg: TelescopeConfig) -> bool:
    """Whether ``connect`` will start this run's own local cluster (no ``ray start`` cluster to
    join); an explicit address that turns out not to answer is not counted (it may be remote)."""
    return _resolve_auto(cfg.ray_address, announce=False) == "local"


def _start_private(options: dict[str, Any]) -> None:
    """Start this run's own Ray cluster, with Ray's token authentication and a token of this run.

    Ray's processes listen on every interface (Ray resolves 127.0.0.1 to the node's address), and
    without authentication anyone who reaches the dashboard agent's job API runs commands as this
    user. The token lives only in this process's environment, which Ray's processes inherit: it
    is never written to a file or logged. ``RAY_AUTH_MODE`` set by the user is respected.

    Only the token is set here: Ray reads ``RAY_AUTH_MODE`` when it is imported, and turns token
    mode on itself (refreshing that setting) for a new local cluster when the mode is unset.
    """
    import ray

    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    options = {**options, "_temp_dir": private_temp_dir()}
    setup_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = setup_log.level
    setup_log.setLevel(logging.ERROR)  # its "token authentication is enabled" notice is ours to give
    try:
        ray.init(address="local", **options)
    finally:
        setup_log.setLevel(level)
    node: Any = ray._private.worker._global_node
    log.info(
        "private Ray cluster with token authentication (RAY_AUTH_MODE=%s); its files and logs: %s",
        os.environ.get("RAY_AUTH_MODE"),
        node.get_session_dir_path(),
    )


def private_temp_dir() -> str:
    """Where the clusters this user's runs start keep their files: ``$TMPDIR/telescope-<uid>/ray``.

    Ray's default, ``/tmp/ray``, is open to every local user (folders 0777, logs 0644), and its logs
    hold the job's ``runtime_env`` in clear (``runtime_env_agent.log``: every ``ray_runtime_env.env_vars``
    entry, API keys included) and the workers' output. Ray makes its own folder 0777, so what keeps
    other users out is the parent, the user's private claims folder (mode 0700, checked to be this
    user's: ``cluster.claims``). Short on purpose: Ray's sockets live below it and a socket path may
    not pass 107 bytes, so it cannot be under the run directory.
    """
    from telescope.core.cluster.claims import claims_dir

    return str(claims_dir("ray"))


def _resolve_auto(address: str, announce: bool = True) -> str:
    """``auto``: the cluster ``ray start`` recorded on this machine, else ``local`` (a private one).

    Ray's own ``auto`` also joins any cluster it sees running here, including the private
    cluster another program (another Telescope run, a notebook, a test) started with
    ``ray.init``; that cluster ends with its driver and its resources are not this run's.
    An address given explicitly (or through RAY_ADDRESS) is joined as asked.
    """
    if address != "auto" or os.environ.get("RAY_ADDRESS"):
        return address
    try:
        from ray._private.services import find_bootstrap_address, find_gcs_addresses

        started, running = find_bootstrap_address(None), set(find_gcs_addresses())
    except (ImportError, AttributeError):  # another Ray version: join as Ray does, checked after connecting
        return address
    if started and started in running and _private_owner(started) is None:
        return str(started)
    others = sorted(running - {started} if started else running)
    if not announce:
        return "local"
    if others:
        log.warning(
            "ray_address auto: not joining %s; starting a private local Ray cluster for this run (give "
            "ray_address to join one)",
            "; ".join(_describe_cluster(a) for a in others),
        )
    else:
        log.info(
            "ray_address auto: no Ray cluster started with `ray start` here: starting a private local one"
        )
    return "local"


def _private_owner(address: str) -> dict[str, Any] | None:
    from telescope.core.cluster.claims import claim_holder

    return claim_holder("ray-clusters", address)


def _describe_cluster(address: str) -> str:
    owner = _private_owner(address)
    if owner is not None:
        return f"{address}, the private cluster of the Telescope run with pid {owner.get('pid')} (run_dir {owner.get('run_dir')})"
    return f"{address}, a private cluster another program started with ray.init"


def _gcs_address() -> str:
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _claim_private(run_dir: str) -> Any:
    """Mark the cluster this run started as private (another run's ``ray_address: auto`` skips it)."""
    from telescope.core.cluster.claims import claim

    address = _gcs_address()
    log.info("started a private local Ray cluster at %s for this run", address)
    return claim("ray-clusters", address, {"run_dir": run_dir, "address": address})


def _joined_another_runs_cluster(address: str) -> bool:
    """``auto`` found a cluster another live Telescope run started for itself: leave it alone.

    An address given explicitly (or through RAY_ADDRESS) is joined as asked.
    """
    if address != "auto" or os.environ.get("RAY_ADDRESS"):
        return False
    gcs = _gcs_address()
    if _private_owner(gcs) is None:
        log.info("ray_address auto: joined the running Ray cluster at %s", gcs)
        return False
    log.warning(
        "ray_address auto: not joining %s; starting a private local Ray cluster for this run (give "
        "ray_address to join one)",
        _describe_cluster(gcs),
    )
    return True


@dataclass
class Pools:
    """Placement groups of the two worker pools."""

    inference: Any
    trainer: Any
    inference_gpus: float
    trainer_gpus: float


def reserve_pools(
    cfg: TelescopeConfig, num_servers: int, use_gpus: bool, run_id: str = "", *, static_cluster: bool = False
) -> Pools:
    """One bundle per inference server and per trainer rank, with the configured strategies.

    The groups are named ``<ray_namespace>-inference-<run_id>`` (and ``-trainer-``): two runs on
    one cluster never ask for the same name. On a ``static_cluster`` (one this run started: no
    autoscaler can add nodes) pools that cannot fit fail at once with the dry run's message instead
    of waiting ``ray_placement_timeout_s``.
    """
    suffix = f"-{run_id or uuid.uuid4().hex[:12]}"
    import ray
    from ray.util.placement_group import placement_group

    if static_cluster:
        from telescope.core.runtime.dryrun import resource_problems

        problems = resource_problems(cfg, "", ray.cluster_resources())
        if problems:
            raise ConfigError("; ".join(problems) + " (the local Ray cluster this run started cannot grow)")

    inf_gpus = float(cfg.inference_tensor_parallel_size) if use_gpus else 0.0
    tr_gpus = 1.0 if use_gpus else 0.0
    inf = placement_group(
        [_bundle(cfg.ray_inference_cpus_per_worker, inf_gpus)] * num_servers,
        strategy=cfg.ray_inference_placement_strategy,
        name=f"{cfg.ray_namespace}-inference{suffix}",
    )
    tr = placement_group(
        [_bundle(cfg.ray_trainer_cpus_per_worker, tr_gpus)] * cfg.trainer_num_workers,
        strategy=cfg.ray_trainer_placement_strategy,
        name=f"{cfg.ray_namespace}-trainer{suffix}",
    )
    for name, pg in (("inference", inf), ("trainer", tr)):
        wait_placed(
            pg, cfg, f"the {name} placement group", f"Lower ray_{name}_cpus_per_worker / the worker counts"
        )
    return Pools(inf, tr, inf_gpus, tr_gpus)


def wait_placed(pg: Any, cfg: TelescopeConfig, what: str, fix: str) -> None:
    """Wait for placement group ``pg``; past ``ray_placement_timeout_s`` raise naming ``what``, the
    cluster's resources and ``fix`` (the run ends with that one line instead of waiting forever)."""
    import ray

    try:
        ray.get(pg.ready(), timeout=cfg.ray_placement_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"{what} could not be placed within ray_placement_timeout_s={cfg.ray_placement_timeout_s}s; "
            f"cluster resources: {ray.cluster_resources()}. {fix}, or add nodes"
        ) from None


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}


def scheduling(pg: Any, index: int) -> Any:
    """Pin an actor to bundle ``index`` of ``pg`` (child tasks stay in the group)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
    )


def _remove_groups(pools: Pools, timeout_s: float = 15.0) -> None:
    """Remove the placement groups from a shared cluster, waiting at most ``timeout_s`` (a cluster in
    trouble can block the call for ever, and teardown must end)."""
    import threading

    from ray.util.placement_group import remove_placement_group

    def remove() -> None:
        for pg in (pools.inference, pools.trainer):
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

    worker = threading.Thread(target=remove, name="telescope-remove-placement-groups", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning(
            "removing the placement groups did not finish within %.0f s; the cluster frees them when "
            "this driver disconnects",
            timeout_s,
        )


def shutdown(cfg: TelescopeConfig, pools: Pools | None, *, started_here: bool = True) -> None:
    """Remove the placement groups and disconnect (which stops a cluster this run started).

    A cluster that was already running is left alone unless ``ray_shutdown_on_exit`` is set:
    then ``ray stop`` ends the Ray processes on this node.
    """
    import ray

    if not ray.is_initialized():
        return
    if pools is not None and not started_here:  # a cluster this run started goes away with its groups
        _remove_groups(pools)
    if not started_here:
        from telescope.core.cluster.run_secret import withdraw_from_ray

        withdraw_from_ray()
    ray.shutdown()
    if cfg.ray_shutdown_on_exit and not started_here:
        import subprocess

        log.info("ray_shutdown_on_exit: stopping the Ray cluster processes on this node (ray stop)")
        subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "stop"], check=False, capture_output=True
        )
