"""vLLM general plugin: the GEMM of unquantized linear layers on vLLM's CPU build.

Why: vLLM's CPU build prepacks every linear layer's weight for oneDNN after loading (a oneDNN
primitive per layer, about 0.3 ms each whatever its size, and the checkpoint-form weight emptied).
A server that only serves never pays that again; a Telescope server re-packs every layer at every
weight sync. With ``VllmEngineKwargs.cpu_weight_prepack`` false (the default), vLLM takes its own
fallback for a CPU without oneDNN: torch's ``linear`` over the weights as loaded, so a sync is vLLM's
weight loaders copying into them and nothing is re-packed. On the quickstart model (float32) the
staged load went from 5.4 to 1.1 ms, with the same tokens and logprobs and decode throughput within
run-to-run noise (bench/vllm_sync.py, bench/inference.py).

How: vLLM calls every ``vllm.general_plugins`` entry point in each of its processes (API server,
engine core, workers) before a model is built. ``choose_cpu_gemm`` does nothing unless the server's
environment carries ``TELESCOPE_VLLM_CPU_WEIGHT_PREPACK=0`` (set by ``VllmEngine.server_command`` on
the CPU build only): then vLLM's ``_custom_ops._supports_onednn`` (read by
``dispatch_cpu_unquantized_gemm`` when a layer is processed) is set false. Other vLLM processes on
the machine, and every GPU build, are untouched. The vLLM contract tests check both names in
vLLM's source.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["PREPACK_ENV", "choose_cpu_gemm", "prepack_disabled", "warn_if_still_prepacking"]

logger = logging.getLogger(__name__)

#: The server's choice (``VllmEngineKwargs.cpu_weight_prepack``): "0" = torch's linear, unpacked weights.
PREPACK_ENV = "TELESCOPE_VLLM_CPU_WEIGHT_PREPACK"


def prepack_disabled() -> bool:
    """Whether this vLLM server was asked to keep its CPU linear weights unpacked."""
    return os.environ.get(PREPACK_ENV) == "0"


def _vllm_ops_still_prepacking() -> Any:
    """vLLM's ``_custom_ops`` when this server asked for unpacked weights and vLLM would still pack
    them for oneDNN; else None."""
    if not prepack_disabled():
        return None
    from vllm import _custom_ops

    return _custom_ops if getattr(_custom_ops, "_supports_onednn", False) else None


def choose_cpu_gemm() -> None:
    """The ``vllm.general_plugins`` entry point (may run several times per process: idempotent)."""
    custom_ops = _vllm_ops_still_prepacking()
    if custom_ops is not None:
        custom_ops._supports_onednn = False
        logger.info("Telescope: CPU linear layers use torch's linear on unpacked weights (%s=0)", PREPACK_ENV)


def warn_if_still_prepacking() -> None:
    """In a vLLM worker: warn when this server was asked for unpacked weights but vLLM still prepacks
    them (the plugin did not run here), so every sync re-packs every layer. Called when the worker
    joins the sync group."""
    if _vllm_ops_still_prepacking() is not None:
        logger.warning(
            "%s=0 but vLLM still prepacks linear weights for oneDNN: the vllm.general_plugins entry "
            "point telescope_cpu_gemm did not run in this worker (VLLM_PLUGINS leaves it out, or "
            "telescope-core was installed before it had one: pip install -e ./telescope-core in "
            "vLLM's environment). Syncs still work, each re-packing every linear layer",
            PREPACK_ENV,
        )
