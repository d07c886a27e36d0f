"""What sandboxes did, as spans: created (to ready), uploads, each command, destroyed.

``SandboxProvider`` records every call here (``SPANS``), with the provider, the image and the
resources of its sandbox, and for a command its text, exit code, duration, whether it timed out or
hit a limit, and the CPU time and memory peak the provider measured (``ExecResult``). The run drains
them once per step (``runtime/sandbox_report.py``): spans on the timeline, ``sandbox/*`` metrics.
A process without a run keeps at most ``MAX_SPANS`` of them (the oldest go).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.sandbox.types import ExecResult, SandboxConfig

__all__ = ["MAX_SPANS", "SPANS", "SandboxSpan", "config_attrs", "exec_attrs"]

MAX_SPANS = 100_000
COMMAND_CHARS = 200
"""A command is kept up to this many characters on its span."""
TAIL_CHARS = 2000
"""The end of a command's stdout and stderr kept on its span (the dashboard escapes them)."""


@dataclass(frozen=True)
class SandboxSpan:
    """One call to a provider: ``action`` is ``create``, ``upload``, ``execute`` or ``destroy``."""

    action: str
    sandbox_id: str
    provider: str
    start: float
    end: float
    env: str = ""
    """The environment whose sample made the call ("" when none was attributed)."""
    failed: str | None = None
    """The exception's class when the call raised."""
    attrs: dict[str, Any] = field(default_factory=dict)


class SpanLog:
    """Spans since the last drain (thread-safe: rewards may run on threads of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: deque[SandboxSpan] = deque(maxlen=MAX_SPANS)

    def add(self, span: SandboxSpan) -> None:
        with self._lock:
            self._spans.append(span)

    def drain(self) -> list[SandboxSpan]:
        with self._lock:
            spans, self._spans = list(self._spans), deque(maxlen=MAX_SPANS)
        return spans


SPANS = SpanLog()


def config_attrs(config: SandboxConfig) -> dict[str, Any]:
    """The span attributes of a sandbox's settings: image and resources."""
    return {
        "image": config.image or "(default)",
        "cpu": config.cpu,
        "memory_mb": config.memory_mb,
        "disk_size_gb": config.disk_size_gb,
    }


def exec_attrs(command: str, result: ExecResult | None) -> dict[str, Any]:
    """The span attributes of a command: its text (cut), and what it did when it finished."""
    shown = command if len(command) <= COMMAND_CHARS else command[:COMMAND_CHARS] + "..."
    attrs: dict[str, Any] = {"command": shown}
    if result is not None:
        attrs.update(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            oom=result.limit_exceeded == "memory",
            limit_exceeded=result.limit_exceeded,
            duration_s=result.duration_s,
            cpu_s=result.cpu_s,
            memory_peak_bytes=result.memory_peak_bytes,
            stdout_tail=result.stdout[-TAIL_CHARS:],
            stderr_tail=result.stderr[-TAIL_CHARS:],
        )
    return attrs
