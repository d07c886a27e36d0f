"""Telescope plugin of telescope-sandboxes: the ``local``, ``e2b``, ``modal``, ``daytona`` and
``prime`` sandbox providers. Factories are imported lazily; a cloud provider whose SDK is not
installed is listed as unavailable with the pip command that fixes it."""

from __future__ import annotations

from importlib.util import find_spec

from pydantic import BaseModel

from telescope.core import hookimpl
from telescope.core.registry import Register
from telescope.sandboxes.daytona import DaytonaSandboxKwargs
from telescope.sandboxes.e2b import E2BSandboxKwargs
from telescope.sandboxes.local.provider import LocalSandboxKwargs
from telescope.sandboxes.modal import ModalSandboxKwargs
from telescope.sandboxes.prime import PrimeSandboxKwargs

#: name -> (SDK module, pip package, kwargs model, credential hint, description)
_CLOUD: dict[str, tuple[str, str, type[BaseModel], str, str]] = {
    "e2b": ("e2b", "e2b", E2BSandboxKwargs, "E2B_API_KEY", "E2B cloud sandboxes"),
    "modal": ("modal", "modal", ModalSandboxKwargs, "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET", "Modal sandboxes"),
    "daytona": ("daytona", "daytona", DaytonaSandboxKwargs, "DAYTONA_API_KEY", "Daytona cloud sandboxes"),
    "prime": (
        "prime_sandboxes",
        "prime-sandboxes",
        PrimeSandboxKwargs,
        "PRIME_API_KEY",
        "Prime Intellect sandboxes",
    ),
}


def _missing_sdk(module: str, pip_name: str, extra: str) -> str | None:
    try:
        if find_spec(module) is not None:
            return None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        pass
    return f"the '{pip_name}' SDK is not installed: pip install 'telescope-sandboxes[{extra}]'"


@hookimpl
def telescope_register_sandbox_providers(register: Register) -> None:
    register.add(
        "local",
        "telescope.sandboxes.local.provider:create_local_provider",
        kwargs_model=LocalSandboxKwargs,
        description="This machine: bubblewrap (no network, read-only system, uid 65534) + rlimits",
    )
    for name, (module, pip_name, kwargs_model, credential, description) in _CLOUD.items():
        register.add(
            name,
            f"telescope.sandboxes.{name}:create_{name}_provider",
            kwargs_model=kwargs_model,
            description=f"{description} ({pip_name} SDK; credentials: {credential})",
            unavailable=_missing_sdk(module, pip_name, name),
        )
