"""Shared pytest setup: `gpu` tests need CUDA, `slow` tests need TELESCOPE_RUN_SLOW=1 or --run-slow,
`vllm_cpu` tests need vLLM installed (`make test-vllm-cpu` runs them in .venv-vllm-cpu)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--run-slow") or os.environ.get("TELESCOPE_RUN_SLOW") == "1"
    has_gpu: bool | None = None
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if item.get_closest_marker("vllm_cpu") and not has_vllm:
            item.add_marker(pytest.mark.skip(reason="vllm_cpu: vLLM is not installed (make test-vllm-cpu)"))
        # Markers, not keywords: keywords also hold directory names (a checkout in .../gpu/).
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: set TELESCOPE_RUN_SLOW=1 or pass --run-slow"))
        if item.get_closest_marker("gpu"):
            if has_gpu is None:
                has_gpu = _cuda_available()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device here"))


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TELESCOPE_CACHE_DIR pointed at a fresh folder (server subprocesses inherit it)."""
    path = str(tmp_path_factory.mktemp("telescope-cache"))
    old = os.environ.get("TELESCOPE_CACHE_DIR")
    os.environ["TELESCOPE_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("TELESCOPE_CACHE_DIR", None)
    else:
        os.environ["TELESCOPE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_path(model_cache: str) -> str:
    """Folder of the built-in tiny model, built once per session in the private cache."""
    from telescope.core.models import resolve_model_path

    return resolve_model_path("telescope/tiny")


@pytest.fixture(scope="session")
def bench_script() -> Callable[[str], ModuleType]:
    """Loads a benchmark script of bench/ by name (``bench_script("ui")``: bench/ui.py) as a module."""

    def load(name: str) -> ModuleType:
        path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
        return module

    return load
