"""The sandbox layer's fault seam: a provider whose creations and commands fail on purpose.

Installed only when ``TELESCOPE_FAULTS`` asks for sandbox faults (``build_provider``, the way
environments build their providers): ``sandbox_create_fail`` makes a creation fail as a provider
answering 503, ``sandbox_exec_kill`` has the provider terminate the sandbox while a command runs.
Both raise what a real provider raises, so the base class classifies and counts them as it would a
real failure (``SandboxProvider._infra_guard``). Unset, providers are used as they are.
"""

from __future__ import annotations

import itertools

from telescope.core import faults
from telescope.core.sandbox.errors import SandboxError, SandboxNotRunningError
from telescope.core.sandbox.provider import SandboxProvider
from telescope.core.sandbox.types import ExecResult, SandboxConfig, SandboxHandle

__all__ = ["FaultySandboxProvider", "with_sandbox_faults"]


class FaultySandboxProvider(SandboxProvider):
    """``provider`` (same name, same sandboxes), with creations and commands failing as asked."""

    def __init__(self, provider: SandboxProvider, create_fail: float, exec_kill: float) -> None:
        self.provider = provider
        self.name = provider.name  # type: ignore[misc]  # its sandboxes' handles name the real provider
        self.create_fail, self.exec_kill = create_fail, exec_kill
        self._creates, self._execs = itertools.count(1), itertools.count(1)

    def check_config(self, config: SandboxConfig) -> None:
        self.provider.check_config(config)

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        if faults.draw("sandbox_create_fail", self.create_fail, str(next(self._creates))):
            raise SandboxError(
                f"{self.name}: 503 Service Unavailable (TELESCOPE_FAULTS: sandbox_create_fail)"
            )
        return await self.provider._create(config)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        if faults.draw("sandbox_exec_kill", self.exec_kill, str(next(self._execs))):
            raise SandboxNotRunningError(
                f"sandbox {handle.id} was terminated by the provider (TELESCOPE_FAULTS: sandbox_exec_kill)",
                sandbox_id=handle.id,
            )
        return await self.provider._execute(handle, command, timeout, working_dir)

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        await self.provider._upload_bytes(handle, remote_path, content)

    async def _destroy(self, handle: SandboxHandle) -> None:
        await self.provider._destroy(handle)

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        self.provider._destroy_sync(handle)

    async def close(self) -> None:
        await self.provider.close()


def with_sandbox_faults(provider: SandboxProvider) -> SandboxProvider:
    """``provider`` wrapped in ``FaultySandboxProvider`` when ``TELESCOPE_FAULTS`` asks for sandbox faults."""
    spec = faults.current()
    if spec is None or not (spec.sandbox_create_fail or spec.sandbox_exec_kill):
        return provider
    return FaultySandboxProvider(provider, spec.sandbox_create_fail, spec.sandbox_exec_kill)
