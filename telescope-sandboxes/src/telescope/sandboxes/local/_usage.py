"""What a command used: CPU seconds and the memory peak, reported on its ``ExecResult``.

With a cgroup per sandbox (``_cgroup``): ``cpu.stat``'s ``usage_usec`` before and after the command
(exact, its processes alone) and ``memory.peak`` (the sandbox's peak so far: the kernel keeps no
per-command peak). Without a cgroup and without bubblewrap: ``getrusage(RUSAGE_CHILDREN)`` before
and after (every child this process reaped meanwhile: approximate when commands run concurrently).
Under bubblewrap without a cgroup nothing is reported (None): the command runs as a grandchild whose
pid namespace is killed with it, never reaped by a process whose usage reaches ours.
"""

from __future__ import annotations

import dataclasses
import os
import resource
from dataclasses import dataclass

from telescope.core.sandbox import ExecResult
from telescope.sandboxes.local._cgroup import SandboxCgroup

__all__ = ["CommandUsage", "measured"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cgroup_value(cgroup: SandboxCgroup, name: str, key: str | None = None) -> int | None:
    """An integer of one of ``cgroup``'s files (``key``: that line of a flat-keyed file); None when unreadable."""
    try:
        with open(os.path.join(cgroup.path, name)) as fh:
            text = fh.read()
    except OSError:
        return None
    if key is None:
        return int(text.strip()) if text.strip().isdigit() else None
    for line in text.splitlines():
        name_, _, value = line.partition(" ")
        if name_ == key and value.strip().isdigit():
            return int(value)
    return None


@dataclass
class CommandUsage:
    """The counters at a command's start; ``end`` puts what it used on its result."""

    cgroup: SandboxCgroup | None
    cpu_at_start: float

    @classmethod
    def begin(cls, cgroup: SandboxCgroup | None, *, reaped_here: bool) -> CommandUsage | None:
        """The counters now; None when nothing can be measured (``reaped_here``: the command is a
        child this process reaps, so ``RUSAGE_CHILDREN`` sees it)."""
        if cgroup is None and not reaped_here:
            return None
        return cls(cgroup, cls._cpu_s(cgroup))

    @staticmethod
    def _cpu_s(cgroup: SandboxCgroup | None) -> float:
        usec = _cgroup_value(cgroup, "cpu.stat", "usage_usec") if cgroup is not None else None
        return usec / 1e6 if usec is not None else _children_cpu_s()

    def end(self, result: ExecResult) -> ExecResult:
        """``result`` with ``cpu_s`` and (with a cgroup) ``memory_peak_bytes``."""
        cpu = max(0.0, self._cpu_s(self.cgroup) - self.cpu_at_start)
        peak = _cgroup_value(self.cgroup, "memory.peak") if self.cgroup is not None else None
        return dataclasses.replace(result, cpu_s=cpu, memory_peak_bytes=peak)


def measured(usage: CommandUsage | None, result: ExecResult) -> ExecResult:
    """``result`` with what ``usage`` measured (as it is when nothing could be)."""
    return result if usage is None else usage.end(result)
