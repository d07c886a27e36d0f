"""Sandboxes: run untrusted code (model-written programs, tool calls) in isolation.

Usage from an environment (the provider comes from the registry by name; ``local`` is the
default and runs on any Linux machine with bubblewrap)::

    from telescope.core.plugins import load_plugins
    from telescope.core.sandbox import SandboxConfig, SandboxPool, build_provider

    _, registry = load_plugins()
    provider = build_provider(registry, "local", {})             # kwargs validated by the plugin
    config = SandboxConfig(memory_mb=512, disk_size_gb=0.5, timeout_seconds=600)

    async with provider.sandbox(config) as sb:                   # one-off sandbox
        await provider.upload_bytes(sb, "prog.py", source.encode())
        result = await provider.execute(sb, "python3 prog.py < input.txt", timeout=5)
        result.exit_code, result.stdout, result.stderr, result.timed_out, result.stdout_truncated

    async with SandboxPool(provider, config, size=4) as pool:    # warm, reused sandboxes
        async with pool.sandbox(timeout=60) as sb:
            ...

``execute`` never raises for what the command did: a non-zero exit, a timeout
(``timed_out=True``, ``exit_code=None``), a limit (``limit_exceeded``) or huge output
(``*_truncated``) are all results. Provider failures raise the `SandboxError` subclasses in
`telescope.core.sandbox.errors`. Every sandbox is destroyed at exit and on SIGINT/SIGTERM.
Writing a provider: subclass `SandboxProvider`, implement ``_create``, ``_execute``,
``_upload_bytes``, ``_destroy`` and ``check_config`` (reject what you cannot honour), and
register it with ``telescope_register_sandbox_providers``.
"""

from __future__ import annotations

from typing import Any

from telescope.core.sandbox.errors import (
    SandboxAuthError,
    SandboxCommandTimeoutError,
    SandboxConfigError,
    SandboxDependencyError,
    SandboxError,
    SandboxImagePullError,
    SandboxNotRunningError,
    SandboxOOMError,
    SandboxPathError,
    SandboxPoolClosedError,
    SandboxPoolTimeoutError,
    SandboxUnavailableError,
)
from telescope.core.sandbox.pool import SandboxPool
from telescope.core.sandbox.provider import SandboxProvider, import_sdk, require_credential
from telescope.core.sandbox.tracking import cleanup_all, live_sandboxes
from telescope.core.sandbox.types import ExecResult, SandboxConfig, SandboxHandle


def build_provider(registry: Any, name: str, kwargs: dict[str, Any] | None = None) -> SandboxProvider:
    """The registered sandbox provider ``name`` built with ``kwargs``: how environments get theirs
    (the seam of ``TELESCOPE_FAULTS``' sandbox faults, ``sandbox/faults.py``)."""
    from telescope.core.sandbox.faults import with_sandbox_faults

    return with_sandbox_faults(registry.create("sandbox_provider", name, kwargs))


__all__ = [
    "ExecResult",
    "SandboxAuthError",
    "SandboxCommandTimeoutError",
    "SandboxConfig",
    "SandboxConfigError",
    "SandboxDependencyError",
    "SandboxError",
    "SandboxHandle",
    "SandboxImagePullError",
    "SandboxNotRunningError",
    "SandboxOOMError",
    "SandboxPathError",
    "SandboxPool",
    "SandboxPoolClosedError",
    "SandboxPoolTimeoutError",
    "SandboxProvider",
    "SandboxUnavailableError",
    "build_provider",
    "cleanup_all",
    "import_sdk",
    "live_sandboxes",
    "require_credential",
]
