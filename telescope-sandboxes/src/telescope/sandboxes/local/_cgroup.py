"""Per-sandbox cgroup v2 limits without root: memory (no swap), processes and CPU, where delegated.

Where ``/sys/fs/cgroup`` is cgroup v2 and this process may manage a subtree (systemd
``Delegate=yes``, a container's own namespace, root), each sandbox gets a child cgroup with
``memory.max`` (+ ``memory.swap.max 0``), ``pids.max`` and ``cpu.max`` from its
``SandboxConfig``; every command joins it before it runs (``join_argv``: a shell writes its own
pid into ``cgroup.procs``, then ``exec``s the command, so no code of the sandbox runs outside),
an OOM kill is read from ``memory.events`` and the cgroup is removed with the sandbox.

Nothing here is needed where it does not apply: the rlimits (``_launch.Limits``) hold on every
machine and stay on (defense in depth). ``find_parent`` says why cgroups cannot be used (one
log line, ``provider.py``). Every path derives from ``root``, so the tests point it at a
directory that mimics cgroupfs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass

__all__ = [
    "CGROUP_ROOT",
    "CONTROLLERS",
    "CgroupLimits",
    "CgroupParent",
    "SandboxCgroup",
    "find_parent",
    "join_argv",
    "own_cgroup",
]

CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids", "cpu")
"""The controllers a sandbox's cgroup needs enabled by its parent (``cgroup.subtree_control``)."""
_SUBTREE = "telescope-sandboxes"
"""The child of this process's own cgroup that holds the sandboxes (the no-internal-processes
rule: a cgroup with processes of its own cannot hand controllers to its children)."""
_CPU_PERIOD_US = 100_000
#: A shell that joins the cgroup whose ``cgroup.procs`` is ``$1``, then runs the rest of its argv.
_JOIN = (
    'echo $$ > "$1" || { echo "telescope sandbox: cannot join the cgroup $1" >&2; exit 125; }; '
    'shift; exec "$@"'
)


@dataclass(frozen=True)
class CgroupLimits:
    """What a sandbox's cgroup holds it to."""

    memory_bytes: int
    """``memory.max``: the sandbox's processes together (page cache included); swap off."""
    pids: int
    """``pids.max``: its processes and threads together."""
    cpus: float
    """``cpu.max``: the CPU time per period, in cores (1.5: one and a half cores' worth)."""

    def files(self) -> dict[str, str]:
        """The cgroup files to write and their contents (``memory.swap.max`` only where it exists)."""
        quota = max(1000, round(self.cpus * _CPU_PERIOD_US))  # the kernel's least quota is 1 ms
        return {
            "memory.max": str(self.memory_bytes),
            "memory.swap.max": "0",
            "pids.max": str(self.pids),
            "cpu.max": f"{quota} {_CPU_PERIOD_US}",
        }


def _mkdir(path: str) -> None:
    """``os.mkdir``: the kernel fills a new cgroup with its interface files (the tests' fake
    cgroupfs replaces this to do the same)."""
    os.mkdir(path)


def own_cgroup(self_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (``/user.slice/...``), from the ``0::`` line; None: none."""
    try:
        with open(self_cgroup) as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip() or "/"
    except OSError:
        return None
    return None


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    # O_WRONLY without O_CREAT: a cgroup file that does not exist is an error, never a new file
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SandboxCgroup:
    """One sandbox's cgroup: joined by each of its commands, removed with the sandbox."""

    path: str

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for ``memory.max`` (``memory.events``)."""
        try:
            text = _read(os.path.join(self.path, "memory.events"))
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def remove(self, wait_s: float = 2.0) -> None:
        """Kill what is left in it (``cgroup.kill``) and remove it; retried while processes exit."""
        with contextlib.suppress(OSError):
            _write(os.path.join(self.path, "cgroup.kill"), "1")  # Linux 5.14+; the command's own kill
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                # EBUSY: killed processes not reaped yet. ENOTEMPTY only outside cgroupfs (whose
                # interface files go with rmdir): a directory mimicking it, whose files go first.
                if exc.errno == errno.ENOTEMPTY:
                    for name in os.listdir(self.path):
                        os.unlink(os.path.join(self.path, name))
                    continue
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


@dataclass(frozen=True)
class CgroupParent:
    """A cgroup this process may create sandboxes' cgroups under, with the controllers enabled."""

    path: str

    def create(self, name: str, limits: CgroupLimits) -> SandboxCgroup:
        """A new child ``name`` holding ``limits`` (removed again when a limit cannot be written)."""
        path = os.path.join(self.path, name)
        _mkdir(path)
        cgroup = SandboxCgroup(path)
        try:
            for file, value in limits.files().items():
                target = os.path.join(path, file)
                if file == "memory.swap.max" and not os.path.exists(target):
                    continue  # no swap accounting (swapaccount=0): there is no swap to limit
                _write(target, value)
        except OSError as exc:
            with contextlib.suppress(OSError):
                cgroup.remove()
            raise OSError(
                exc.errno, f"local sandbox: cannot set the limits of cgroup {path}: {exc.strerror}"
            ) from exc
        return cgroup


def find_parent(
    root: str = CGROUP_ROOT, self_cgroup: str = "/proc/self/cgroup", parent: str | None = None
) -> CgroupParent | str:
    """The cgroup to create sandboxes' cgroups under, or why there is none (a sentence).

    ``parent`` (the provider's ``cgroup_parent``): a delegated cgroup, relative to ``root``,
    that this process is not in (e.g. prepared by the operator); else ``telescope-sandboxes``
    under this process's own cgroup. The controllers ``CONTROLLERS`` are enabled on the way
    (``cgroup.subtree_control``), which needs write access to it: delegation.
    """
    if not os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return f"{root} is not a cgroup v2 hierarchy (cgroup v1 or hybrid)"
    if parent is not None:
        base = os.path.join(root, parent.strip("/"))
        if not os.path.isdir(base):
            return f"cgroup_parent {parent!r} does not exist under {root}"
        holder = base
    else:
        own = own_cgroup(self_cgroup)
        if own is None:
            return f"this process has no cgroup v2 path in {self_cgroup}"
        holder = os.path.join(root, own.strip("/"))
        base = os.path.join(holder, _SUBTREE)
    available = _read(os.path.join(holder, "cgroup.controllers")).split()
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"the controllers {', '.join(missing)} are not available in {holder} (cgroup.controllers)"
    if not os.access(os.path.join(holder, "cgroup.subtree_control"), os.W_OK):
        return f"{holder} is not delegated to this user (cgroup.subtree_control is not writable)"
    try:
        if parent is None:
            with contextlib.suppress(FileExistsError):
                _mkdir(base)
        for cgroup in (holder, base) if parent is None else (base,):
            _enable(cgroup)
    except OSError as exc:
        hint = (
            " (a cgroup that holds processes cannot hand controllers to its children: set "
            "cgroup_parent to a delegated cgroup this process is not in)"
            if exc.errno == errno.EBUSY
            else ""
        )
        return f"cannot enable {' '.join(CONTROLLERS)} for the sandboxes' cgroups: {exc}{hint}"
    return CgroupParent(base)


def _enable(cgroup: str) -> None:
    control = os.path.join(cgroup, "cgroup.subtree_control")
    enabled = _read(control).split()
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if wanted:
        _write(control, " ".join(f"+{c}" for c in wanted))


def join_argv(cgroup: SandboxCgroup, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``cgroup`` (exit 125 when it cannot).

    The pid is written before anything of the sandbox runs (``exec`` keeps it), so every process
    of the command starts inside the cgroup: no window in which a fork escapes the limits.
    """
    return ["/bin/sh", "-c", _JOIN, "sh", cgroup.procs, *argv]
