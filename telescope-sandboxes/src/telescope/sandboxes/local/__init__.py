"""The ``local`` sandbox provider (bubblewrap on this machine)."""

from __future__ import annotations

from telescope.sandboxes.local.provider import LocalSandboxKwargs, LocalSandboxProvider, create_local_provider

__all__ = ["LocalSandboxKwargs", "LocalSandboxProvider", "create_local_provider"]
