"""Sandboxes: run untrusted code (model-written programs, tool calls) in isolation.

Usage from an environment (the provider comes from the registry by name; ``local`` is the
default and runs on any Linux machine with bubblewrap)::

    from telescope.core.plugins import load_plugins
    from telescope.core.sandbox import SandboxConfig, SandboxPool

    _, registry = load_plugins()
    provider = registry.create("sandbox_provider", "local", {})   # kwargs validated by the plugin
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
    "cleanup_all",
    "import_sdk",
    "live_sandboxes",
    "require_credential",
]
