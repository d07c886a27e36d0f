"""The ``e2b`` sandbox provider, on the official ``e2b`` SDK (``AsyncSandbox``).

CPU, memory and disk are properties of an E2B template, so explicit values for them are
rejected (build a template with the resources you need and name it in ``template``).
"""

from __future__ import annotations

from typing import Any

from telescope.core.sandbox import (
    ExecResult,
    SandboxAuthError,
    SandboxConfig,
    SandboxError,
    SandboxHandle,
    SandboxImagePullError,
    SandboxNotRunningError,
)
from telescope.sandboxes._cloud import CloudSandboxProvider, KeyedCloudKwargs, capped_result, reject_explicit

__all__ = ["E2BSandboxKwargs", "E2BSandboxProvider", "create_e2b_provider"]

_PROVIDER = "e2b"


class E2BSandboxKwargs(KeyedCloudKwargs):
    """Settings of the ``e2b`` provider (``api_key`` None: the ``E2B_API_KEY`` environment variable)."""

    template: str | None = None
    """Template name or ID; None: ``SandboxConfig.image`` if set, else E2B's base template."""
    domain: str | None = None
    """E2B domain (self-hosted deployments); None: the SDK default."""
    request_timeout_s: float = 60.0
    """Timeout of each API request (not of commands)."""


class E2BSandboxProvider(CloudSandboxProvider):
    """Sandboxes on E2B."""

    name = _PROVIDER
    credential_env = ("E2B_API_KEY",)
    kwargs: E2BSandboxKwargs

    def __init__(self, kwargs: E2BSandboxKwargs | None = None) -> None:
        super().__init__(kwargs or E2BSandboxKwargs(), sdk="e2b", pip_name="e2b", extra="e2b")

    def check_config(self, config: SandboxConfig) -> None:
        reject_explicit(
            config,
            _PROVIDER,
            ("cpu", "memory_mb", "disk_size_gb", "max_processes"),
            "E2B takes resources from the template (set them when building it)",
        )
        reject_explicit(config, _PROVIDER, ("gpu_count",), "E2B offers no GPUs")

    def sdk_errors(self) -> dict[type[BaseException], type[SandboxError]]:
        sdk = self.sdk
        return {
            sdk.AuthenticationException: SandboxAuthError,
            sdk.SandboxNotFoundException: SandboxNotRunningError,
            sdk.NotFoundException: SandboxNotRunningError,
            sdk.TemplateException: SandboxImagePullError,
        }

    def _opts(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"api_key": self.api_key, "request_timeout": self.kwargs.request_timeout_s}
        if self.kwargs.domain:
            opts["domain"] = self.kwargs.domain
        return opts

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        metadata = dict(config.labels)
        if config.name:
            metadata["name"] = config.name
        with self.mapped_errors(None, "creating a sandbox"):
            sandbox = await self.sdk.AsyncSandbox.create(
                template=self.kwargs.template or config.image or None,
                timeout=config.timeout_seconds,
                metadata=metadata or None,
                envs=dict(config.environment_vars) or None,
                allow_internet_access=config.network_access,
                **self._opts(),
            )
        return SandboxHandle(sandbox.sandbox_id, self.name, config, native=sandbox)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        cap = handle.config.max_output_bytes
        with self.mapped_errors(handle.id, "running a command"):
            try:
                result = await handle.native.commands.run(command, cwd=working_dir, timeout=timeout)
            except self.sdk.CommandExitException as exc:  # non-zero exit: a result, not an error
                return capped_result(exc.exit_code, exc.stdout, exc.stderr, cap)
            except self.sdk.TimeoutException:
                return capped_result(None, "", "", cap, timed_out=True)
        return capped_result(result.exit_code, result.stdout, result.stderr, cap)

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        with self.mapped_errors(handle.id, f"uploading {remote_path}"):
            await handle.native.files.write(remote_path, content)

    async def _destroy(self, handle: SandboxHandle) -> None:
        with self.mapped_errors(handle.id, "destroying the sandbox"):
            await handle.native.kill()

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        self.sdk.Sandbox.kill(handle.id, **self._opts())


def create_e2b_provider(kwargs: E2BSandboxKwargs | None = None) -> E2BSandboxProvider:
    """Registry factory of the ``e2b`` provider."""
    return E2BSandboxProvider(kwargs)
