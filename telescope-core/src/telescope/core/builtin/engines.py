"""Core built-in plugin: the ``transformers`` and ``vllm`` inference engines (lazy factories)."""

from __future__ import annotations

from telescope.core import hookimpl
from telescope.core.inference.auto import vllm_unavailable_reason
from telescope.core.inference.settings import TransformersEngineKwargs, VllmEngineKwargs
from telescope.core.registry import Register


@hookimpl
def telescope_register_inference_engines(register: Register) -> None:
    """Register both engines; vllm is listed as unavailable where it cannot be imported."""
    register.add(
        "transformers",
        "telescope.core.inference.transformers_engine.engine:create_transformers_engine",
        kwargs_model=TransformersEngineKwargs,
        description="Embedded engine: transformers + KV cache + request batching; runs anywhere (CPU included)",
    )
    register.add(
        "vllm",
        "telescope.core.inference.vllm_engine.engine:create_vllm_engine",
        kwargs_model=VllmEngineKwargs,
        description="vLLM OpenAI server launched from the resolved config (GPU)",
        unavailable=vllm_unavailable_reason(),
    )
