"""The ``daytona`` sandbox provider, on the official ``daytona`` SDK (``AsyncDaytona``).

Daytona takes whole CPUs and whole GiB of memory and disk: other values are rejected rather
than rounded. The lifetime is honoured with ``ttl_minutes`` (rounded up to a minute).
Daytona's ``exec`` returns one combined output: it is reported as stdout, stderr is empty.
"""

from __future__ import annotations

import math
from typing import Any

from telescope.core.sandbox import (
    ExecResult,
    SandboxAuthError,
    SandboxConfig,
    SandboxError,
    SandboxHandle,
    SandboxNotRunningError,
)
from telescope.sandboxes._cloud import (
    CloudSandboxProvider,
    KeyedCloudKwargs,
    capped_result,
    reject_explicit,
    whole,
)

__all__ = ["DaytonaSandboxKwargs", "DaytonaSandboxProvider", "create_daytona_provider"]

_PROVIDER = "daytona"


class DaytonaSandboxKwargs(KeyedCloudKwargs):
    """Settings of the ``daytona`` provider (``api_key`` None: ``DAYTONA_API_KEY``, or ``DAYTONA_JWT_TOKEN``)."""

    api_url: str | None = None
    """API URL; None: the SDK default (or ``DAYTONA_API_URL``)."""
    target: str | None = None
    """Target region; None: the organisation's default."""
    default_image: str = "python:3.11-slim"
    """Image used when ``SandboxConfig.image`` is empty."""
    create_timeout_s: float = 300.0
    """How long sandbox creation may take."""


class DaytonaSandboxProvider(CloudSandboxProvider):
    """Sandboxes on Daytona."""

    name = _PROVIDER
    credential_env = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN")
    kwargs: DaytonaSandboxKwargs

    def __init__(self, kwargs: DaytonaSandboxKwargs | None = None) -> None:
        super().__init__(kwargs or DaytonaSandboxKwargs(), sdk="daytona", pip_name="daytona", extra="daytona")
        self._client: Any = None

    def _config(self) -> Any:
        return self.sdk.DaytonaConfig(
            api_key=self.api_key, api_url=self.kwargs.api_url, target=self.kwargs.target
        )

    def client(self) -> Any:
        """The SDK client, created on first use (inside the running event loop)."""
        if self._client is None:
            self._client = self.sdk.AsyncDaytona(self._config())
        return self._client

    def check_config(self, config: SandboxConfig) -> None:
        reject_explicit(config, _PROVIDER, ("max_processes",), "Daytona has no process limit")
        whole(config.cpu, provider=_PROVIDER, field="cpu", unit="CPUs")
        whole(config.memory_mb, provider=_PROVIDER, field="memory_mb", unit="GiB", per=1024)
        whole(config.disk_size_gb, provider=_PROVIDER, field="disk_size_gb", unit="GiB")

    def sdk_errors(self) -> dict[type[BaseException], type[SandboxError]]:
        return {
            self.sdk.DaytonaAuthenticationError: SandboxAuthError,
            self.sdk.DaytonaNotFoundError: SandboxNotRunningError,
        }

    def _params(self, config: SandboxConfig) -> Any:
        resources = self.sdk.Resources(
            cpu=round(config.cpu),
            memory=config.memory_mb // 1024,
            disk=round(config.disk_size_gb),
            gpu=config.gpu_count or None,
        )
        return self.sdk.CreateSandboxFromImageParams(
            image=config.image or self.kwargs.default_image,
            resources=resources,
            name=config.name or None,
            env_vars=dict(config.environment_vars) or None,
            labels=dict(config.labels) or None,
            ttl_minutes=math.ceil(config.timeout_seconds / 60),
            network_block_all=config.network_access is False or None,
        )

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        with self.mapped_errors(None, "creating a sandbox"):
            sandbox = await self.client().create(self._params(config), timeout=self.kwargs.create_timeout_s)
        return SandboxHandle(sandbox.id, self.name, config, native=sandbox)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        cap = handle.config.max_output_bytes
        with self.mapped_errors(handle.id, "running a command"):
            try:
                response = await handle.native.process.exec(
                    command, cwd=working_dir, timeout=max(1, math.ceil(timeout))
                )
            except self.sdk.DaytonaTimeoutError:
                return capped_result(None, "", "", cap, timed_out=True)
        return capped_result(response.exit_code, response.result, "", cap)

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        with self.mapped_errors(handle.id, f"uploading {remote_path}"):
            await handle.native.fs.upload_file(content, remote_path)

    async def _destroy(self, handle: SandboxHandle) -> None:
        with self.mapped_errors(handle.id, "destroying the sandbox"):
            await self.client().delete(handle.native)

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        client = self.sdk.Daytona(self._config())
        client.delete(client.get(handle.id))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def create_daytona_provider(kwargs: DaytonaSandboxKwargs | None = None) -> DaytonaSandboxProvider:
    """Registry factory of the ``daytona`` provider."""
    return DaytonaSandboxProvider(kwargs)
