"""The `SandboxProvider` base class every provider plugin implements.

Public methods (``create``, ``execute``, ``upload_bytes``, ``upload_file``, ``destroy``,
``bulk_destroy``) validate their arguments, keep the live-sandbox record and then call the
provider's ``_create`` / ``_execute`` / ``_upload_bytes`` / ``_destroy``. A provider
implements only those and, when it cannot honour a setting, ``check_config``.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from telescope.core.infra import env_name, infra_cause, mark
from telescope.core.sandbox import tracking
from telescope.core.sandbox.errors import (
    SandboxAuthError,
    SandboxDependencyError,
    SandboxError,
    SandboxNotRunningError,
    infra_cause_of,
)
from telescope.core.sandbox.telemetry import SPANS, SandboxSpan, config_attrs, exec_attrs
from telescope.core.sandbox.types import ExecResult, SandboxConfig, SandboxHandle

__all__ = ["SandboxProvider", "import_sdk", "require_credential"]

T = TypeVar("T")


def import_sdk(module: str, *, provider: str, pip_name: str, extra: str) -> ModuleType:
    """Import a provider SDK, or raise `SandboxDependencyError` naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise SandboxDependencyError(
            f"the '{provider}' sandbox provider needs the '{pip_name}' package ({exc}): "
            f"pip install 'telescope-sandboxes[{extra}]' (or pip install {pip_name})"
        ) from exc


def require_credential(value: str | None, env_vars: tuple[str, ...], *, provider: str) -> str:
    """Return ``value`` or the first set environment variable, else raise `SandboxAuthError`."""
    if value:
        return value
    for var in env_vars:
        if os.environ.get(var):
            return os.environ[var]
    names = " or ".join(env_vars)
    raise SandboxAuthError(
        f"the '{provider}' sandbox provider needs credentials: set {names}, "
        "or pass api_key in the provider kwargs"
    )


class SandboxProvider(ABC):
    """Async sandbox provider. One instance may serve many sandboxes concurrently."""

    #: Registered name, used in messages and on handles.
    name: ClassVar[str] = "sandbox"

    # ----------------------------------------------------------------- to implement
    def check_config(self, config: SandboxConfig) -> None:
        """Raise `SandboxConfigError` for any setting this provider cannot honour."""
        return None  # optional hook: the default accepts every setting

    @abstractmethod
    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        """Create a sandbox for a config that passed ``check_config``."""

    @abstractmethod
    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        """Run ``command`` through a shell; a command timeout is ``ExecResult.timed_out``."""

    @abstractmethod
    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        """Write ``content`` to ``remote_path`` inside the sandbox (parents created)."""

    @abstractmethod
    async def _destroy(self, handle: SandboxHandle) -> None:
        """Release the sandbox and everything running in it."""

    def _destroy_sync(self, handle: SandboxHandle) -> None:
        """Blocking destroy for exit/signal handlers; default: ``_destroy`` on a private loop."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(asyncio.wait_for(self._destroy(handle), 30))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)

        worker = threading.Thread(target=run, name=f"destroy-{handle.id}", daemon=True)
        worker.start()
        worker.join(35)
        if errors:
            raise errors[0]

    async def close(self) -> None:
        """Release provider-wide resources (clients, connections). Sandboxes are not touched."""
        return None  # optional hook: nothing to release by default

    # ----------------------------------------------------------------- public API
    async def create(self, config: SandboxConfig | None = None) -> SandboxHandle:
        """Create a sandbox; raises `SandboxConfigError` for settings the provider cannot honour."""
        config = config if config is not None else SandboxConfig()
        self.check_config(config)
        handle = await self._observed("create", self._create(config), None, config_attrs(config))
        tracking.track(self, handle)
        return handle

    async def execute(
        self,
        handle: SandboxHandle,
        command: str,
        timeout: float = 60.0,
        working_dir: str | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` (``bash`` where the image has it).

        A command that runs past ``timeout`` seconds is killed and reported as
        ``ExecResult(timed_out=True, exit_code=None)``; provider failures raise `SandboxError`.
        """
        self._check_live(handle)
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"execute: command must be a non-empty string, got {command!r}")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"execute: timeout must be a positive number of seconds, got {timeout!r}")
        call = self._execute(handle, command, float(timeout), working_dir)
        return await self._observed("execute", call, handle, exec_attrs(command, None))

    async def upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        """Write ``content`` to ``remote_path`` (relative paths are relative to the workdir)."""
        self._check_live(handle)
        if not remote_path:
            raise ValueError("upload_bytes: remote_path must be a non-empty path")
        call = self._upload_bytes(handle, remote_path, bytes(content))
        await self._observed("upload", call, handle, {"path": remote_path, "bytes": len(content)})

    async def upload_file(self, handle: SandboxHandle, remote_path: str, local_path: str | Path) -> None:
        """Copy the local file ``local_path`` to ``remote_path`` in the sandbox."""
        content = await asyncio.to_thread(Path(local_path).read_bytes)
        await self.upload_bytes(handle, remote_path, content)

    async def destroy(self, handle: SandboxHandle) -> None:
        """Destroy the sandbox; destroying it again is a no-op."""
        self._check_owner(handle)
        if handle.destroyed:
            return
        handle.destroyed = True  # before awaiting: a concurrent destroy() is a no-op
        tracking.untrack(handle)
        try:
            await self._observed("destroy", self._destroy(handle), handle, {})
        except BaseException:
            self._retrack(handle)
            raise

    async def bulk_destroy(self, handles: Iterable[SandboxHandle]) -> None:
        """Destroy many sandboxes concurrently; raises one `SandboxError` listing failures."""
        handles = list(handles)
        results = await asyncio.gather(*(self.destroy(h) for h in handles), return_exceptions=True)
        failed = [(h, r) for h, r in zip(handles, results, strict=True) if isinstance(r, BaseException)]
        if failed:
            detail = "; ".join(f"{h.id}: {type(r).__name__}: {r}" for h, r in failed)
            raise SandboxError(
                f"{self.name}: {len(failed)}/{len(handles)} sandboxes failed to destroy: {detail}"
            )

    def destroy_sync(self, handle: SandboxHandle) -> None:
        """Blocking destroy (used at exit and in signal handlers)."""
        if handle.destroyed:
            return
        handle.destroyed = True
        tracking.untrack(handle)
        self._destroy_sync(handle)

    @asynccontextmanager
    async def sandbox(self, config: SandboxConfig | None = None) -> AsyncIterator[SandboxHandle]:
        """``async with provider.sandbox(cfg) as handle:`` creates and always destroys."""
        handle = await self.create(config)
        try:
            yield handle
        finally:
            await self.destroy(handle)

    # ----------------------------------------------------------------- helpers
    async def _observed(
        self, action: str, call: Awaitable[T], handle: SandboxHandle | None, attrs: dict[str, Any]
    ) -> T:
        """``call``, recorded as a span (``telemetry.SPANS``); an infrastructure failure
        (``errors.infra_cause_of``) is counted here and marked (``infra.mark``) before it propagates,
        as it is: callers keep branching on its class."""
        start, failed = time.time(), None
        result: Any = None
        try:
            result = await call
            return result  # type: ignore[no-any-return]
        except Exception as exc:
            failed = type(exc).__name__
            cause = infra_cause_of(exc, action)
            if cause is not None and infra_cause(exc) is None:
                mark(exc, cause=cause, provider=self.name)
            attrs = {**attrs, "error": f"{failed}: {exc}"[:500], "infra_cause": cause}
            raise
        finally:
            config = handle.config if handle is not None else getattr(result, "config", None)
            if isinstance(result, ExecResult):
                attrs = {**attrs, **exec_attrs(attrs["command"], result)}
            sandbox_id = handle.id if handle is not None else getattr(result, "id", "")
            where = {**config_attrs(config), **attrs} if config is not None else attrs
            SPANS.add(
                SandboxSpan(action, sandbox_id, self.name, start, time.time(), env_name(), failed, where)
            )

    def _check_owner(self, handle: SandboxHandle) -> None:
        if handle.provider != self.name:
            raise SandboxError(
                f"sandbox {handle.id} belongs to provider '{handle.provider}', not '{self.name}'",
                sandbox_id=handle.id,
            )

    def _retrack(self, handle: SandboxHandle) -> None:
        # A failed destroy may have left the sandbox running: keep it for the exit cleanup.
        handle.destroyed = False
        tracking.track(self, handle)

    def _check_live(self, handle: SandboxHandle) -> None:
        self._check_owner(handle)
        if handle.destroyed:
            raise SandboxNotRunningError(f"sandbox {handle.id} was destroyed", sandbox_id=handle.id)
