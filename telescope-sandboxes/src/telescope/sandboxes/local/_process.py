"""Run one sandbox command: capped output, a wall-clock timeout that kills the whole process
group, and a disk watchdog for the workspace."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from telescope.core.sandbox.types import ExecResult
from telescope.sandboxes.local._usernet import UserNet
from telescope.sandboxes.local._workspace import Workspace

__all__ = ["RunSpec", "kill_group", "run_command"]

_CHUNK = 1 << 16
#: After the main process ends or is killed, how long stragglers may keep the pipes open.
_DRAIN_GRACE_S = 0.5


@dataclass
class RunSpec:
    """What to run and under which limits."""

    argv: list[str]
    env: dict[str, str] | None
    cwd: str | None
    preexec: Callable[[], None] | None
    timeout: float
    max_output_bytes: int
    workspace: Workspace
    disk_limit_bytes: int
    disk_check_interval: float
    running: set[asyncio.subprocess.Process] = field(default_factory=set)
    usernet: UserNet | None = None
    """The command's outbound-only network (``network_access``), attached once it started."""
    owned_fds: tuple[int, ...] = ()
    """Descriptors the child inherits (the seccomp program); closed here once it started."""


class _CappedReader:
    """Drain a pipe to EOF, keeping the first ``cap`` bytes."""

    def __init__(self, stream: asyncio.StreamReader | None, cap: int) -> None:
        self.stream, self.cap = stream, cap
        self.data = bytearray()
        self.truncated = False

    async def run(self) -> None:
        if self.stream is None:
            return
        while chunk := await self.stream.read(_CHUNK):
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by ``proc`` (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _watch_disk(spec: RunSpec) -> str:
    while True:
        await asyncio.sleep(spec.disk_check_interval)
        used = await asyncio.to_thread(spec.workspace.disk_usage)
        if used > spec.disk_limit_bytes:
            return "disk"


async def run_command(spec: RunSpec) -> ExecResult:
    """Run ``spec.argv``; never raises for what the command does (only for failing to start)."""
    started = time.monotonic()
    child_fds = (*(spec.usernet.child_fds if spec.usernet else ()), *spec.owned_fds)
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=spec.env,
            cwd=spec.cwd,
            preexec_fn=spec.preexec,
            start_new_session=True,
            pass_fds=child_fds,
        )
    except BaseException:
        if spec.usernet is not None:
            await spec.usernet.close()
        raise
    finally:
        for fd in spec.owned_fds:
            os.close(fd)
    spec.running.add(proc)
    if spec.usernet is not None:
        try:
            await spec.usernet.attach()
        except BaseException:
            kill_group(proc)
            await proc.wait()
            spec.running.discard(proc)
            await spec.usernet.close()
            raise
    out, err = (
        _CappedReader(proc.stdout, spec.max_output_bytes),
        _CappedReader(proc.stderr, spec.max_output_bytes),
    )
    readers = [asyncio.create_task(out.run()), asyncio.create_task(err.run())]
    waiter = asyncio.create_task(proc.wait())
    watchdog = asyncio.create_task(_watch_disk(spec))
    try:
        done, _ = await asyncio.wait(
            {waiter, watchdog}, timeout=spec.timeout, return_when=asyncio.FIRST_COMPLETED
        )
        timed_out = not done
        limit = watchdog.result() if watchdog in done else None
        if waiter not in done:
            kill_group(proc)
        await waiter
        # Stragglers (background children) may still hold the pipes: give them a moment.
        _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
        if pending:
            kill_group(proc)
            await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
    finally:
        watchdog.cancel()
        for task in readers:
            task.cancel()
        if proc.returncode is None:
            kill_group(proc)
        spec.running.discard(proc)
        if spec.usernet is not None:
            await spec.usernet.close()
    finished = not timed_out and limit is None
    return ExecResult(
        exit_code=proc.returncode if finished else None,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        timed_out=timed_out,
        limit_exceeded=limit,
        duration_s=time.monotonic() - started,
    )
