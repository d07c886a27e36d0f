"""``vllm serve`` arguments and environment from the *resolved* run config.

Every server receives every value explicitly (the anchor's servers re-read packaged defaults
in a fresh interpreter and silently ignored user settings: see the module docstring of
``telescope.core.inference.settings`` for the field-by-field mapping).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.weights.settings import serving_dtype

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = [
    "CPU_BLOCK_SIZE",
    "GUARD_MIDDLEWARE",
    "LORA_ADAPTER_NAME",
    "LORA_DIR_ENV",
    "MANAGED_FLAGS",
    "VLLM_LORA_RANKS",
    "WORKER_EXTENSION",
    "build_vllm_args",
    "build_vllm_env",
    "build_vllm_secret_env",
    "check_vllm_config",
    "kv_block_size",
    "otlp_endpoint",
    "vllm_max_lora_rank",
]

log = logging.getLogger("telescope.inference")

WORKER_EXTENSION = "telescope.core.inference.vllm_engine.worker.TelescopeWeightSyncExtension"
#: The ASGI middleware that guards every route and serves the control routes (``vllm_engine.guard``).
GUARD_MIDDLEWARE = "telescope.core.inference.vllm_engine.guard.TelescopeGuard"

#: The name requests give as ``model`` to be served with the run's adapter (``lora_rank > 0``): the
#: adapter is registered under it at the first applied sync and reloaded in place at every later one.
LORA_ADAPTER_NAME = "telescope-lora"
#: Where a LoRA server's worker writes each received adapter (a PEFT folder per version) for vLLM to load.
LORA_DIR_ENV = "TELESCOPE_LORA_DIR"
#: ``--max-lora-rank`` accepts only these values (vLLM's ``MaxLoRARanks``, the same in 0.16 and 0.33; the contract tests check it).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: ``--block-size`` on vLLM's CPU build (``block_size`` unset): the smallest its attention kernels take
#: (multiples of 32). Its own default, 128, caches no prefix of a prompt under 129 tokens, so a GRPO
#: group's samples recomputed their whole shared prompt (0 hits in 20,480 prompt tokens of the
#: quickstart's 5 steps); with 32 every prompt of 33+ tokens shares its whole blocks.
CPU_BLOCK_SIZE = 32

#: Flags Telescope sets itself; ``extra_args`` may not repeat them.
MANAGED_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--tensor-parallel-size",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--scheduling-policy",
    "--dtype",
    "--seed",
    "--logprobs-mode",
    "--worker-extension-cls",
    "--generation-config",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--block-size",
    "--otlp-traces-endpoint",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--disable-uvicorn-access-log",
    "--api-key",
    "--enable-lora",
    "--max-lora-rank",
    "--max-loras",
    "--max-cpu-loras",
)


def check_vllm_config(cfg: TelescopeConfig, kwargs: VllmEngineKwargs) -> None:
    """Reject settings the vllm engine cannot honour (message names the field, the value and the fix)."""
    if cfg.top_p is not None and cfg.top_p < 1:
        raise ValueError(
            f"top_p: {cfg.top_p} with inference_engine vllm: vLLM's processed logprobs are renormalised over the "
            "top-p nucleus, which differs from the trainer's temperature-only logprobs; set top_p: null or use "
            "inference_engine: transformers"
        )
    if cfg.lora_rank > 0:
        vllm_max_lora_rank(cfg.lora_rank)  # raises for a rank vLLM cannot serve
    kv_block_size(kwargs, _installed_cpu_build())  # raises for a block size the CPU build cannot use
    repeated = sorted({a.split("=", 1)[0] for a in kwargs.extra_args} & set(MANAGED_FLAGS))
    if repeated:
        raise ValueError(
            f"vllm extra_args repeat flags Telescope sets from the run config: {', '.join(repeated)}; "
            "set the matching config field instead"
        )


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of rank ``rank``
    (vLLM pads smaller adapters to it; their scaling stays ``lora_alpha / rank``)."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"lora_rank: {rank} with inference_engine vllm: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]} "
        f"(--max-lora-rank is one of {', '.join(map(str, VLLM_LORA_RANKS))}); set lora_rank <= "
        f"{VLLM_LORA_RANKS[-1]} or use inference_engine: transformers"
    )


def build_vllm_args(
    cfg: TelescopeConfig,
    kwargs: VllmEngineKwargs,
    *,
    model_path: str,
    index: int,
    host: str,
    port: int,
    otlp_endpoint: str | None = None,
    cpu_build: bool | None = None,
) -> list[str]:
    """Arguments after ``vllm serve`` for server ``index``; ``otlp_endpoint`` None = no tracing;
    ``cpu_build``: whether vLLM's CPU build serves (None: the installed distribution says)."""
    args = [
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        cfg.model,
        "--tensor-parallel-size",
        str(cfg.inference_tensor_parallel_size),
        "--gpu-memory-utilization",
        str(cfg.gpu_memory_utilization),
        "--max-model-len",
        str(cfg.max_model_len),
        "--scheduling-policy",
        cfg.vllm_scheduling_policy,
        "--dtype",
        serving_dtype(cfg),
        "--seed",
        str(cfg.seed + index),
        # Sampled-token logprobs after temperature: the trainer's definition (top_p is checked above).
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        # Sampling defaults come from our requests only, never from the model's generation_config.json.
        "--generation-config",
        "vllm",
        "--enable-prefix-caching" if kwargs.enable_prefix_caching else "--no-enable-prefix-caching",
        # The run's secret on every route, control routes without dev mode (the key itself travels
        # as VLLM_API_KEY in the environment, never on the command line: build_vllm_secret_env).
        "--middleware",
        GUARD_MIDDLEWARE,
    ]
    if cfg.lora_rank > 0:
        # One adapter, the run's: loaded at the first sync and reloaded in place at each later one
        # (worker.py), so one GPU slot and one CPU cache entry are all it ever needs.
        args += [
            "--enable-lora",
            "--max-lora-rank",
            str(vllm_max_lora_rank(cfg.lora_rank)),
            "--max-loras",
            "1",
            "--max-cpu-loras",
            "1",
        ]
    if not cfg.inference_access_log:  # a line per request buries the server's own log lines
        args.append("--disable-uvicorn-access-log")
    if otlp_endpoint is not None:
        args += ["--otlp-traces-endpoint", otlp_endpoint]
    block_size = kv_block_size(kwargs, _installed_cpu_build() if cpu_build is None else cpu_build)
    if block_size is not None:
        args += ["--block-size", str(block_size)]
    if kwargs.max_num_seqs is not None:
        args += ["--max-num-seqs", str(kwargs.max_num_seqs)]
    if kwargs.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(kwargs.max_num_batched_tokens)]
    return args + list(kwargs.extra_args)


def kv_block_size(kwargs: VllmEngineKwargs, cpu_build: bool) -> int | None:
    """The ``--block-size`` to launch with: ``block_size``, else ``CPU_BLOCK_SIZE`` on vLLM's CPU
    build, else None (vLLM's default). A CPU build's must be a multiple of ``CPU_BLOCK_SIZE`` (vLLM
    itself says so only minutes later, from its worker: "No common block size")."""
    if kwargs.block_size is None:
        return CPU_BLOCK_SIZE if cpu_build else None
    if cpu_build and kwargs.block_size % CPU_BLOCK_SIZE:
        raise ValueError(
            f"vllm block_size: {kwargs.block_size} on vLLM's CPU build: its attention takes only multiples of "
            f"{CPU_BLOCK_SIZE}; set block_size to {CPU_BLOCK_SIZE} (the default there) or a multiple of it"
        )
    return kwargs.block_size


def _installed_cpu_build() -> bool:
    from telescope.core.inference.vllm_engine.distribution import installed_vllm

    installed = installed_vllm()
    return installed is not None and installed.cpu_build


def otlp_endpoint(cfg: TelescopeConfig, driver_host: str) -> str | None:
    """The OTLP traces URL of the driver's receiver, or None when tracing is off or cannot run here.

    vLLM refuses to start with ``--otlp-traces-endpoint`` unless the OpenTelemetry SDK and the
    OTLP exporter import, so without them tracing is dropped with a warning instead.
    """
    from telescope.core.inference.auto import tracing_unavailable_reason

    if not cfg.enable_vllm_tracing:
        return None
    reason = tracing_unavailable_reason()
    if reason is not None:
        log.warning("enable_vllm_tracing: tracing disabled: %s", reason)
        return None
    return f"http://{driver_host}:{cfg.otlp_receiver_port}/v1/traces"


def build_vllm_env(cfg: TelescopeConfig, *, tracing: bool | None = None) -> dict[str, str]:
    """Environment of a vLLM server process (``tracing`` defaults to ``enable_vllm_tracing``).

    Dev mode stays off even when the user's environment turns it on: its routes (``/collective_rpc``,
    ``/sleep``, ``/server_info``, ...) would be vLLM's, not the guard's (``vllm_engine.guard`` serves
    the control routes a run needs).
    """
    env = {
        "VLLM_SERVER_DEV_MODE": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if cfg.enable_vllm_tracing if tracing is None else tracing:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    return env


def build_vllm_secret_env(*, tracing: bool) -> dict[str, str]:
    """Variables of a vLLM server that carry the run's secret, as templates of ``{secret}`` (filled by
    ``ServerProcess`` at launch, so no command, log line or ``repr`` ever holds the value): vLLM's own
    ``--api-key`` (``/v1`` routes) and, with tracing, the header its OTLP exporter sends to the
    driver's receiver (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``, values URL-encoded)."""
    env = {"VLLM_API_KEY": "{secret}"}
    if tracing:
        env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "Authorization=Bearer%20{secret}"
    return env
