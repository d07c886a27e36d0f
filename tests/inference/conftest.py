"""Fixtures of the inference tests: a private model cache and in-process servers on 127.0.0.1."""

from __future__ import annotations

import json
import tempfile
from typing import Any


def make_cfg(**overrides: object):  # type: ignore[no-untyped-def]
    """A run config for the tiny model; one torch thread keeps the 2-core CI machine responsive."""
    from telescope.core.testing import make_config

    # float32 servers: these tests compare logprobs and weights with float32 references exactly.
    base = {
        "model": "telescope/tiny",
        "max_model_len": 512,
        "ray_inference_cpus_per_worker": 1.0,
        "seed": 7,
        "inference_dtype": "float32",
    }
    return make_config(**{**base, **overrides})


class FakeVllmReload:
    """Fake of the vLLM modules the worker extension's layer-wise load uses (vLLM is not importable on
    CPU CI): ``vllm.config.set_current_vllm_config`` and the layer-wise reload helpers, recording the
    order in which they and the model's ``load_weights`` run. The run's config says
    ``vllm_weight_reload: layerwise`` (the staged path reads real vLLM layers: ``make test-vllm-cpu``)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def install(self, monkeypatch: Any) -> None:
        import contextlib
        import sys
        import types

        @contextlib.contextmanager
        def set_current_vllm_config(
            config: Any, check_compile: bool = False, prefix: str | None = None
        ) -> Any:
            self.events.append(f"config {config} enter")
            yield
            self.events.append(f"config {config} exit")

        modules = {
            "vllm": types.ModuleType("vllm"),
            "vllm.config": types.ModuleType("vllm.config"),
            "vllm.model_executor": types.ModuleType("vllm.model_executor"),
            "vllm.model_executor.model_loader": types.ModuleType("vllm.model_executor.model_loader"),
            "vllm.model_executor.model_loader.reload": types.ModuleType(
                "vllm.model_executor.model_loader.reload"
            ),
        }
        modules["vllm.config"].set_current_vllm_config = set_current_vllm_config  # type: ignore[attr-defined]
        reload = modules["vllm.model_executor.model_loader.reload"]
        reload.initialize_layerwise_reload = lambda model: self.events.append("initialize_layerwise_reload")  # type: ignore[attr-defined]
        reload.finalize_layerwise_reload = lambda model, model_config: self.events.append(  # type: ignore[attr-defined]
            f"finalize_layerwise_reload {model_config}"
        )
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        config = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        with config:
            json.dump({"vllm_weight_reload": "layerwise"}, config)
        monkeypatch.setenv("TELESCOPE_RESOLVED_CONFIG", config.name)
