"""The ``modal`` sandbox provider, on the official ``modal`` SDK (``modal.Sandbox``, async API).

Honoured: image, cpu, memory, GPUs (with ``gpu_type``), lifetime, environment variables,
``network_access=False`` (``block_network``), labels (tags). Disk size and process limits
cannot be set on Modal sandboxes and are rejected.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from typing import Any

from telescope.core.sandbox import (
    ExecResult,
    SandboxAuthError,
    SandboxConfig,
    SandboxConfigError,
    SandboxError,
    SandboxHandle,
    SandboxImagePullError,
    SandboxNotRunningError,
)
from telescope.sandboxes._cloud import CloudKwargs, CloudSandboxProvider, capped_result, reject_explicit

__all__ = ["ModalSandboxKwargs", "ModalSandboxProvider", "create_modal_provider"]

_PROVIDER = "modal"


class ModalSandboxKwargs(CloudKwargs):
    """Settings of the ``modal`` provider (credentials: ``modal token set`` or MODAL_TOKEN_ID/SECRET)."""

    app_name: str = "telescope-sandboxes"
    """Modal app the sandboxes belong to (created if missing)."""
    python_version: str = "3.11"
    """Python of the default image (``debian_slim``) used when ``SandboxConfig.image`` is empty."""
    gpu_type: str | None = None
    """GPU type for ``gpu_count > 0`` (e.g. ``"A10G"``, ``"H100"``)."""
    region: str | None = None
    """Region to run in; None: Modal's choice."""


class ModalSandboxProvider(CloudSandboxProvider):
    """Sandboxes on Modal."""

    name = _PROVIDER
    kwargs: ModalSandboxKwargs

    def __init__(self, kwargs: ModalSandboxKwargs | None = None) -> None:
        super().__init__(kwargs or ModalSandboxKwargs(), sdk="modal", pip_name="modal", extra="modal")
        self._app: Any = None
        has_env = os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")
        if not has_env and not os.path.exists(os.path.expanduser("~/.modal.toml")):
            raise SandboxAuthError(
                "the 'modal' sandbox provider needs credentials: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, "
                "or run `modal token set`"
            )

    def check_config(self, config: SandboxConfig) -> None:
        reject_explicit(
            config, _PROVIDER, ("disk_size_gb", "max_processes"), "Modal sandboxes have no such limit"
        )
        if config.gpu_count and not self.kwargs.gpu_type:
            raise SandboxConfigError(
                f"modal sandbox: gpu_count={config.gpu_count} needs gpu_type in the provider kwargs (e.g. 'A10G')"
            )

    def sdk_errors(self) -> dict[type[BaseException], type[SandboxError]]:
        exc_mod = self.sdk.exception
        return {
            exc_mod.AuthError: SandboxAuthError,
            exc_mod.NotFoundError: SandboxNotRunningError,
            exc_mod.SandboxTerminatedError: SandboxNotRunningError,
            exc_mod.ImageBuildError: SandboxImagePullError,
        }

    def _image(self, config: SandboxConfig) -> Any:
        if config.image:
            return self.sdk.Image.from_registry(config.image)
        return self.sdk.Image.debian_slim(python_version=self.kwargs.python_version)

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        gpu = f"{self.kwargs.gpu_type}:{config.gpu_count}" if config.gpu_count else None
        with self.mapped_errors(None, "creating a sandbox"):
            if self._app is None:
                self._app = await self.sdk.App.lookup.aio(self.kwargs.app_name, create_if_missing=True)
            sandbox = await self.sdk.Sandbox.create.aio(
                app=self._app,
                name=config.name or None,
                tags=dict(config.labels) or None,
                image=self._image(config),
                env=dict(config.environment_vars) or None,
                timeout=config.timeout_seconds,
                cpu=config.cpu,
                memory=config.memory_mb,
                gpu=gpu,
                region=self.kwargs.region,
                block_network=config.network_access is False,
            )
        return SandboxHandle(sandbox.object_id, self.name, config, native=sandbox)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        cap = handle.config.max_output_bytes
        with self.mapped_errors(handle.id, "running a command"):
            try:
                proc = await handle.native.exec.aio(
                    "sh", "-c", command, timeout=max(1, round(timeout)), workdir=working_dir
                )
                exit_code = await proc.wait.aio()
                stdout = await proc.stdout.read.aio()
                stderr = await proc.stderr.read.aio()
            except self.sdk.exception.ExecTimeoutError:
                return capped_result(None, "", "", cap, timed_out=True)
        return capped_result(exit_code, stdout, stderr, cap)

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        parent = posixpath.dirname(remote_path) or "."
        script = f"mkdir -p {shlex.quote(parent)} && cat > {shlex.quote(remote_path)}"
        with self.mapped_errors(handle.id, f"uploading {remote_path}"):
            proc = await handle.native.exec.aio("sh", "-c", script, text=False)
            proc.stdin.write(content)
            proc.stdin.write_eof()
            await proc.stdin.drain.aio()
            exit_code = await proc.wait.aio()
        if exit_code != 0:
            raise SandboxError(
                f"modal: writing {remote_path} failed with exit code {exit_code}", sandbox_id=handle.id
            )

    async def _destroy(self, handle: SandboxHandle) -> None:
        with self.mapped_errors(handle.id, "destroying the sandbox"):
            await handle.native.terminate.aio()

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        self.sdk.Sandbox.from_id(handle.id).terminate()


def create_modal_provider(kwargs: ModalSandboxKwargs | None = None) -> ModalSandboxProvider:
    """Registry factory of the ``modal`` provider."""
    return ModalSandboxProvider(kwargs)
