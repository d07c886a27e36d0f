"""``inference_engine: auto``: vllm when it is importable and a GPU is present, else transformers."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

__all__ = ["resolve_inference_engine", "vllm_unavailable_reason"]

log = logging.getLogger("telescope.inference")


def vllm_unavailable_reason() -> str | None:
    """Why the vllm engine cannot run here, or None when it can be imported (no import happens)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'telescope-core[vllm]' on a CUDA machine)"
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
    """Return ``(engine, why)`` for the ``inference_engine`` field; logs the choice for ``auto``."""
    if requested != "auto":
        return requested, f"inference_engine: {requested} (set in the config)"
    vllm_ok = has_vllm() if has_vllm else vllm_unavailable_reason() is None
    gpu_ok = has_gpu() if has_gpu else _cuda_available()
    if vllm_ok and gpu_ok:
        choice, why = "vllm", "inference_engine: auto chose vllm (vllm importable, CUDA GPU present)"
    else:
        missing = [m for m, ok in (("vllm is not installed", vllm_ok), ("no CUDA GPU", gpu_ok)) if not ok]
        choice, why = "transformers", f"inference_engine: auto chose transformers ({' and '.join(missing)})"
    log.info(why)
    return choice, why
