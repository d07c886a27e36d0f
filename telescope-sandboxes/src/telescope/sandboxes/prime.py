"""The ``prime`` sandbox provider, on Prime Intellect's ``prime-sandboxes`` SDK
(``AsyncSandboxClient``).

Prime takes whole CPU cores and whole GB of memory and disk and a lifetime in minutes:
other values are rejected rather than rounded down. It cannot block all outbound network,
so ``network_access=False`` is rejected.
"""

from __future__ import annotations

import asyncio
import math
import posixpath
from typing import Any

from pydantic import Field

from telescope.core.sandbox import (
    ExecResult,
    SandboxAuthError,
    SandboxConfig,
    SandboxError,
    SandboxHandle,
    SandboxImagePullError,
    SandboxNotRunningError,
    SandboxOOMError,
)
from telescope.sandboxes._cloud import (
    CloudSandboxProvider,
    KeyedCloudKwargs,
    capped_result,
    reject_explicit,
    whole,
)

__all__ = ["PrimeSandboxKwargs", "PrimeSandboxProvider", "create_prime_provider"]

_PROVIDER = "prime"


class PrimeSandboxKwargs(KeyedCloudKwargs):
    """Settings of the ``prime`` provider (``api_key`` None: the ``PRIME_API_KEY`` environment variable)."""

    default_image: str = "python:3.11-slim"
    """Docker image used when ``SandboxConfig.image`` is empty."""
    team_id: str | None = None
    """Team to bill; None: the key's personal account."""
    start_command: list[str] = Field(default_factory=lambda: ["tail", "-f", "/dev/null"], min_length=1)
    """Process (executable and arguments, no shell) that keeps the sandbox alive between executions."""
    upload_timeout_s: int = 60
    """Timeout of one file upload."""


class PrimeSandboxProvider(CloudSandboxProvider):
    """Sandboxes on Prime Intellect."""

    name = _PROVIDER
    credential_env = ("PRIME_API_KEY",)
    kwargs: PrimeSandboxKwargs

    def __init__(self, kwargs: PrimeSandboxKwargs | None = None) -> None:
        super().__init__(
            kwargs or PrimeSandboxKwargs(), sdk="prime_sandboxes", pip_name="prime-sandboxes", extra="prime"
        )
        self._clients: dict[int, Any] = {}

    def client(self) -> Any:
        """One SDK client per event loop (its connections belong to the loop)."""
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._clients:
            self._clients[loop_id] = self.sdk.AsyncSandboxClient(api_key=self.api_key)
        return self._clients[loop_id]

    def check_config(self, config: SandboxConfig) -> None:
        reject_explicit(config, _PROVIDER, ("max_processes",), "Prime has no process limit")
        if config.network_access is False:
            reject_explicit(config, _PROVIDER, ("network_access",), "Prime cannot block all outbound network")
        whole(config.cpu, provider=_PROVIDER, field="cpu", unit="cores")
        whole(config.memory_mb, provider=_PROVIDER, field="memory_mb", unit="GB", per=1024)
        whole(config.disk_size_gb, provider=_PROVIDER, field="disk_size_gb", unit="GB")
        whole(config.timeout_seconds, provider=_PROVIDER, field="timeout_seconds", unit="minutes", per=60)

    def sdk_errors(self) -> dict[type[BaseException], type[SandboxError]]:
        sdk = self.sdk
        return {
            sdk.UnauthorizedError: SandboxAuthError,
            sdk.SandboxNotRunningError: SandboxNotRunningError,
            sdk.SandboxOOMError: SandboxOOMError,
            sdk.SandboxImagePullError: SandboxImagePullError,
        }

    def _start_command(self) -> Any:
        from prime_sandboxes.models import StartCommand

        executable, *args = self.kwargs.start_command
        return StartCommand(executable=executable, args=args)

    def _request(self, config: SandboxConfig) -> Any:
        return self.sdk.CreateSandboxRequest(
            name=config.name or "telescope-sandbox",
            docker_image=config.image or self.kwargs.default_image,
            start_command=self._start_command(),
            cpu_cores=round(config.cpu),
            memory_gb=config.memory_mb // 1024,
            disk_size_gb=round(config.disk_size_gb),
            gpu_count=config.gpu_count,
            timeout_minutes=config.timeout_seconds // 60,
            environment_vars=dict(config.environment_vars) or None,
            labels=[f"{k}={v}" for k, v in config.labels.items()],
            team_id=self.kwargs.team_id,
        )

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        client = self.client()
        with self.mapped_errors(None, "creating a sandbox"):
            sandbox = await client.create(self._request(config))
            await client.wait_for_creation(sandbox.id)
        return SandboxHandle(sandbox.id, self.name, config, native=sandbox)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        cap = handle.config.max_output_bytes
        with self.mapped_errors(handle.id, "running a command"):
            try:
                response = await self.client().execute_command(
                    handle.id, command, working_dir=working_dir, timeout=max(1, math.ceil(timeout))
                )
            except self.sdk.CommandTimeoutError:
                return capped_result(None, "", "", cap, timed_out=True)
        return capped_result(response.exit_code, response.stdout, response.stderr, cap)

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        with self.mapped_errors(handle.id, f"uploading {remote_path}"):
            await self.client().upload_bytes(
                handle.id,
                remote_path,
                content,
                posixpath.basename(remote_path),
                timeout=self.kwargs.upload_timeout_s,
            )

    async def _destroy(self, handle: SandboxHandle) -> None:
        with self.mapped_errors(handle.id, "destroying the sandbox"):
            await self.client().delete(handle.id)

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        self.sdk.SandboxClient(self.sdk.APIClient(api_key=self.api_key)).delete(handle.id)

    async def close(self) -> None:
        client = self._clients.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.aclose()


def create_prime_provider(kwargs: PrimeSandboxKwargs | None = None) -> PrimeSandboxProvider:
    """Registry factory of the ``prime`` provider."""
    return PrimeSandboxProvider(kwargs)
