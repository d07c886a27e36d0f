"""Sandbox data types: what to create (`SandboxConfig`), what was created (`SandboxHandle`),
and what a command did (`ExecResult`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ExecResult", "SandboxConfig", "SandboxHandle"]


class SandboxConfig(BaseModel):
    """Resources and settings of one sandbox. Providers reject what they cannot honour."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    image: str = ""
    """Container image (cloud providers). Empty: the provider's default image. ``local`` runs
    on the host's read-only system files and accepts only an empty image."""
    cpu: float = Field(default=1.0, gt=0, le=256)
    """CPU cores. ``local`` cannot reserve cores: it accepts any value and enforces CPU time
    (``timeout``-derived RLIMIT_CPU) instead."""
    memory_mb: int = Field(default=2048, ge=16, le=1_048_576)
    """Memory limit in MiB (``local``: the address-space limit of every process)."""
    disk_size_gb: float = Field(default=3.0, gt=0, le=10_000)
    """Writable disk in GB (``local``: the workspace size and the largest file)."""
    gpu_count: int = Field(default=0, ge=0, le=16)
    """GPUs; only providers that offer GPUs accept a non-zero value."""
    timeout_seconds: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    """Sandbox lifetime in seconds; the pool retires sandboxes near the end of it."""
    environment_vars: dict[str, str] = Field(default_factory=dict)
    """Environment variables of every command run in the sandbox."""
    name: str = ""
    """Human-readable name (shown by cloud dashboards); empty: generated."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels/metadata attached to the sandbox where the provider supports them."""
    network_access: bool | None = None
    """Outbound network. ``None``: the provider's default (``local``: none). ``False`` is
    rejected by providers that cannot block the network."""
    max_processes: int = Field(default=256, ge=1, le=65_536)
    """Maximum processes/threads (``local``: RLIMIT_NPROC of the sandbox uid)."""
    max_output_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    """Stdout and stderr are each cut at this many bytes (``ExecResult.*_truncated`` is set)."""

    @field_validator("environment_vars")
    @classmethod
    def _check_env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or "=" in key or "\0" in key or key[0].isdigit():
                raise ValueError(f"invalid environment variable name {key!r}: use [A-Za-z_][A-Za-z0-9_]*")
        return value


@dataclass
class SandboxHandle:
    """A live sandbox. ``native`` holds the provider's own object (SDK sandbox, workspace...)."""

    id: str
    provider: str
    config: SandboxConfig
    native: Any = None
    created_at: float = field(default_factory=time.monotonic)
    destroyed: bool = False

    @property
    def expires_at(self) -> float:
        """Monotonic time at which the provider may reclaim the sandbox."""
        return self.created_at + self.config.timeout_seconds

    def remaining_fraction(self, now: float | None = None) -> float:
        """Share of the lifetime still left, in [0, 1]."""
        now = time.monotonic() if now is None else now
        left = (self.expires_at - now) / self.config.timeout_seconds
        return min(1.0, max(0.0, left))


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command.

    ``exit_code`` is ``None`` when the command did not finish by itself (timed out or was
    killed for exceeding a limit); a negative value ``-N`` means it was killed by signal N.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    limit_exceeded: str | None = None
    """Which limit ended the command early (e.g. ``"disk"``), if any."""
    duration_s: float = 0.0
    cpu_s: float | None = None
    """CPU seconds the command used (user + system), where the provider measures it."""
    memory_peak_bytes: int | None = None
    """The sandbox's memory peak while the command ran, where the provider measures it."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0 by itself."""
        return self.exit_code == 0 and not self.timed_out and self.limit_exceeded is None
