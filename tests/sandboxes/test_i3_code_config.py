"""i3_code's SandboxConfig passes only what the user set, through every real provider's
``check_config`` (the providers are built from the installed SDKs with placeholder
credentials; nothing leaves the machine)."""

from __future__ import annotations

from typing import Any

import pytest

from telescope.core.sandbox import SandboxConfigError
from telescope.envs.i3_code import I3CodeEnvironment
from telescope.envs.kwargs import I3CodeKwargs

CREDENTIALS = {
    "E2B_API_KEY": "e2b_x",
    "DAYTONA_API_KEY": "dtn_x",
    "PRIME_API_KEY": "pk_x",
    "MODAL_TOKEN_ID": "ak-x",
    "MODAL_TOKEN_SECRET": "as-x",
}
PROVIDERS = {
    "e2b": ("e2b", "E2BSandboxProvider"),
    "modal": ("modal", "ModalSandboxProvider"),
    "daytona": ("daytona", "DaytonaSandboxProvider"),
    "prime": ("prime_sandboxes", "PrimeSandboxProvider"),
    "local": (None, "LocalSandboxProvider"),
}


def _provider(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    sdk, cls_name = PROVIDERS[name]
    if sdk is not None:
        pytest.importorskip(sdk)
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    import importlib

    module = importlib.import_module(
        f"telescope.sandboxes.{name}" if sdk else "telescope.sandboxes.local.provider"
    )
    cls = getattr(module, cls_name)
    if name == "local":
        from telescope.sandboxes.local.provider import LocalSandboxKwargs

        return cls(LocalSandboxKwargs(allow_unsandboxed=True))
    return cls()


def _config(**kwargs: Any) -> Any:
    return I3CodeEnvironment(I3CodeKwargs(**kwargs)).sandbox_config()


# Daytona's SDK lives in .venv-daytona (`make test-daytona` runs the `daytona`-marked cases there).
NAMES = [pytest.param(n, marks=pytest.mark.daytona) if n == "daytona" else n for n in sorted(PROVIDERS)]


@pytest.mark.parametrize("name", NAMES)
def test_default_i3_code_config_is_accepted_by_every_provider(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config()
    assert config.model_fields_set == {"name", "timeout_seconds"}  # nothing the user did not set
    assert config.timeout_seconds == 3600
    _provider(name, monkeypatch).check_config(config)


# One case per provider, so each runs in the venv that has its SDK.
EXPLICIT_SETTINGS = {"memory_mb": 4096, "cpu": 2, "docker_image": "python:3.12"}
EXPLICIT = [
    pytest.param("e2b", EXPLICIT_SETTINGS, "memory_mb=4096", id="e2b"),  # resources come from the template
    pytest.param(
        "daytona", EXPLICIT_SETTINGS, None, id="daytona", marks=pytest.mark.daytona
    ),  # whole CPUs and GiB: accepted
    pytest.param("modal", {"disk_size_gb": 2}, "disk_size_gb", id="modal"),  # Modal has no disk limit
]


def test_explicit_settings_reach_the_provider() -> None:
    config = _config(**EXPLICIT_SETTINGS)
    assert config.model_fields_set == {"name", "timeout_seconds", "memory_mb", "cpu", "image"}
    assert (config.memory_mb, config.cpu, config.image) == (4096, 2, "python:3.12")


@pytest.mark.parametrize(("name", "settings", "error"), EXPLICIT)
def test_explicit_settings_are_checked_by_the_provider(
    name: str, settings: dict[str, Any], error: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = _provider(name, monkeypatch)
    if error is None:
        provider.check_config(_config(**settings))
    else:
        with pytest.raises(SandboxConfigError, match=error):
            provider.check_config(_config(**settings))
