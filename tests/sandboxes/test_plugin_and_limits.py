"""Registration through the plugin system, import lightness, and the limits a command sees."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from telescope.core.plugins import load_plugins
from telescope.core.sandbox import SandboxConfig
from telescope.core.testing import heavy_imports_after
from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

from .conftest import run

PROVIDERS = ["daytona", "e2b", "local", "modal", "prime"]


def test_every_provider_is_registered_with_a_strict_kwargs_model() -> None:
    _, registry = load_plugins()
    assert registry.names("sandbox_provider") == PROVIDERS
    for name in PROVIDERS:
        component = registry.get("sandbox_provider", name)
        assert component.kwargs_model is not None and component.description
        component.kwargs_model()  # defaults are valid
        with pytest.raises(ValidationError):
            component.kwargs_model(no_such_setting=1)


def test_local_is_created_through_the_registry_and_runs(shutil_bwrap: None) -> None:
    _, registry = load_plugins()
    provider = registry.create("sandbox_provider", "local", {"disk_check_interval_s": 0.2})
    assert isinstance(provider, LocalSandboxProvider) and provider.kwargs.disk_check_interval_s == 0.2

    async def go() -> str:
        async with provider.sandbox() as sb:
            return (await provider.execute(sb, "echo $((6 * 7))", timeout=5)).stdout

    assert run(go()) == "42\n"


def test_missing_sdk_makes_a_provider_unavailable_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import telescope.sandboxes.plugin as plugin

    monkeypatch.setattr(plugin, "find_spec", lambda name: None)
    _, registry = load_plugins()
    component = registry.get("sandbox_provider", "daytona")
    assert not component.available
    assert "pip install 'telescope-sandboxes[daytona]'" in (component.unavailable or "")


@pytest.mark.daytona  # also in .venv-daytona, where Daytona's SDK is installed
def test_plugin_import_is_light() -> None:
    code = "import telescope.sandboxes.plugin, telescope.core.sandbox"
    heavy = ("torch", "ray", "transformers", "e2b", "modal", "daytona", "prime_sandboxes")
    assert heavy_imports_after(code, heavy) == []


@pytest.fixture
def shutil_bwrap() -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")


@pytest.mark.parametrize("wrappers", [True, False], ids=["setpriv-prlimit", "preexec"])
def test_command_runs_with_the_configured_limits(shutil_bwrap: None, wrappers: bool) -> None:
    provider = LocalSandboxProvider(LocalSandboxKwargs(use_util_linux_wrappers=wrappers))
    config = SandboxConfig(memory_mb=300, disk_size_gb=0.25, max_processes=20)

    async def go() -> str:
        async with provider.sandbox(config) as sb:
            return (
                await provider.execute(
                    sb, "cat /proc/self/limits; id -u; grep CapEff /proc/self/status", timeout=7
                )
            ).stdout

    out = run(go())
    limits = {
        line[:26].strip(): line[26:].split()[:2] for line in out.splitlines()[1:] if line.startswith("Max ")
    }
    assert limits["Max address space"] == [str(300 * 1024 * 1024)] * 2
    assert limits["Max file size"] == [str(int(0.25e9))] * 2
    # Set inside the sandbox's user namespace; 2: bubblewrap's init and the command's shell.
    assert limits["Max processes"] == [str(20 + 2)] * 2
    assert limits["Max cpu time"] == ["8", "9"]  # ceil(timeout) + 1, hard + 1
    assert limits["Max core file size"] == ["0", "0"]
    assert "65534" in out.splitlines() and "CapEff:\t0000000000000000" in out
