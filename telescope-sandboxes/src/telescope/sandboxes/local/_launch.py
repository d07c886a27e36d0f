"""How a local sandbox command is started: the bubblewrap command line and the limits that
the child process applies to itself before ``exec`` (rlimits, unprivileged uid, death signal)."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import resource
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from telescope.sandboxes.local._workspace import INSIDE_TMP, INSIDE_WORKSPACE, Workspace, ensure_private_dir

__all__ = [
    "DEFAULT_RO_PATHS",
    "Limits",
    "bwrap_argv",
    "make_preexec",
    "nproc_counted_per_user_namespace",
    "snapshot_etc",
    "wrapper_argv",
]

#: Host paths visible (read-only) inside the sandbox: the system, never /home, /root or /work.
DEFAULT_RO_PATHS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/python3",
    "/etc/python3.11",
)

#: Processes bubblewrap itself needs (outer bwrap, the namespace's init) on top of the user's,
#: when RLIMIT_NPROC is set before bubblewrap starts (without bubblewrap: the shell and spare).
_BWRAP_PROCESSES = 4
#: Inside the sandbox's user namespace: bubblewrap's init (pid 1) and the command's shell.
_NAMESPACE_PROCESSES = 2
#: Sets RLIMIT_NPROC (soft and hard) in the sandbox, then runs the command (``$1``): ``-u`` in
#: bash, ``-p`` in dash and busybox.
_ULIMIT_THEN_EXEC = 'ulimit -u {n} 2>/dev/null || ulimit -p {n} || exit 126; exec /bin/sh -c "$1"'
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits, applied with setrlimit in the child."""

    address_space_bytes: int
    cpu_seconds: int
    file_size_bytes: int
    processes: int | None
    """RLIMIT_NPROC set before the command starts; None inside bubblewrap (see
    ``sandbox_processes``) and without it when not root (it would count the user's own processes)."""
    sandbox_processes: int | None = None
    """RLIMIT_NPROC set inside bubblewrap's new user namespace, where the kernel (5.14+:
    per-namespace ucounts) counts only the sandbox's processes: holds without root."""
    open_files: int = 1024

    @classmethod
    def for_command(
        cls,
        memory_mb: int,
        disk_gb: float,
        max_processes: int,
        timeout: float,
        *,
        private_uid: bool = True,
        user_namespace: bool = True,
    ) -> Limits:
        """``private_uid``: the command runs under a uid of its own (Telescope is root);
        ``user_namespace``: under bubblewrap, which gives it a new user namespace."""
        return cls(
            address_space_bytes=memory_mb << 20,
            cpu_seconds=math.ceil(timeout) + 1,
            file_size_bytes=max(1, int(disk_gb * 1e9)),
            processes=max_processes + _BWRAP_PROCESSES if private_uid and not user_namespace else None,
            sandbox_processes=max_processes + _NAMESPACE_PROCESSES if user_namespace else None,
        )


def nproc_counted_per_user_namespace(release: str | None = None) -> bool:
    """Whether the kernel (``release``, default this one's) counts RLIMIT_NPROC per (user
    namespace, uid), as Linux does since 5.14 (ucounts); before, per uid across the machine."""
    found = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def bwrap_argv(
    bwrap: str,
    ws: Workspace,
    *,
    inside_cwd: str,
    env: dict[str, str],
    ro_paths: tuple[str, ...],
    network: bool,
    command: str,
    shm_bytes: int,
    etc_dir: str | None = None,
    network_args: tuple[str, ...] = (),
    seccomp_fd: int | None = None,
    max_processes: int | None = None,
) -> list[str]:
    """The bubblewrap command line for one command.

    ``shm_bytes`` sizes /dev/shm; ``etc_dir`` (from `snapshot_etc`) replaces the individual
    ``/etc/...`` entries of ``ro_paths`` with one mount. The command always gets its own network
    namespace; with ``network`` it gets outbound access through ``network_args``
    (``_usernet.UserNet.bwrap_args``), never the host's namespace and its loopback services.
    ``seccomp_fd`` (from ``_seccomp.program_fd``) is read by bubblewrap, which installs the
    filter after its own setup, right before it runs the command. ``max_processes``
    (``Limits.sandbox_processes``) is set as RLIMIT_NPROC inside the new user namespace, so that
    it counts the sandbox's processes only, never the user's others on the host.
    """
    if network and not network_args:
        raise ValueError("network=True needs the user-mode network's bubblewrap options (UserNet.bwrap_args)")
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    argv += ["--new-session", "--cap-drop", "ALL", "--uid", str(ws.uid), "--gid", str(ws.gid)]
    argv += ["--hostname", "sandbox"]
    if network:
        argv += network_args
    if etc_dir is not None:
        argv += ["--ro-bind", etc_dir, "/etc"]
        ro_paths = tuple(p for p in ro_paths if not p.startswith("/etc/"))
    # The workspace and its /tmp first: a read-only path the user names under /tmp (a venv, a
    # checkout) is then mounted over the sandbox's /tmp instead of hidden by it.
    argv += ["--bind", ws.work, INSIDE_WORKSPACE, "--bind", ws.tmp, INSIDE_TMP]
    for path in ro_paths:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(shm_bytes), "--tmpfs", "/dev/shm"]
    # bubblewrap's own root and /dev are writable tmpfs (host RAM outside the disk limit):
    # make them read-only once every mount point exists.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv.append("--clearenv")
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", inside_cwd, "--", "/bin/sh", "-c"]
    if max_processes is None:
        return [*argv, command]
    limit, _ = _within_hard_limit(resource.RLIMIT_NPROC, max_processes)
    return [*argv, _ULIMIT_THEN_EXEC.format(n=limit), "sh", command]


def snapshot_etc(parent: str, ro_paths: tuple[str, ...]) -> str:
    """A private copy of the ``/etc/...`` entries of ``ro_paths``, shared by every provider.

    Each bind mount costs bubblewrap time on every command; one mount of a snapshot replaces
    about ten. Only world-readable entries are copied (symlinks kept as symlinks). The
    directory name hashes the paths and their modification times, so a changed host file
    gives a new snapshot and an unchanged one is reused (no per-process leftovers).
    """
    entries = sorted(p for p in ro_paths if p.startswith("/etc/") and os.path.lexists(p))
    key = hashlib.sha256(repr([(p, os.lstat(p).st_mtime_ns) for p in entries]).encode()).hexdigest()[:16]
    final = os.path.join(ensure_private_dir(parent), f"etc-{os.geteuid()}-{key}")
    if os.path.isdir(final):
        return final
    staging = tempfile.mkdtemp(prefix="etc-staging-", dir=parent)
    for path in entries:
        target = os.path.join(staging, os.path.relpath(path, "/etc"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.copytree(path, target, symlinks=True, ignore=_unreadable)
        elif os.path.islink(path) or os.stat(path).st_mode & stat.S_IROTH:
            shutil.copy2(path, target, follow_symlinks=False)
    for dirpath, _, _ in os.walk(staging):
        os.chmod(dirpath, 0o755)
    try:
        os.rename(staging, final)
    except OSError:  # another process published the same snapshot first
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _unreadable(directory: str, names: list[str]) -> list[str]:
    skip = []
    for name in names:
        full = os.path.join(directory, name)
        if not os.path.islink(full) and not os.stat(full).st_mode & stat.S_IROTH:
            skip.append(name)
    return skip


def wrapper_argv(limits: Limits, uid: int | None, gid: int | None) -> list[str] | None:
    """``setpriv`` + ``prlimit`` (util-linux) prefix doing what ``make_preexec`` does.

    Preferred over a ``preexec_fn``: without one, Python starts the child with ``vfork``,
    which costs the same for a small script and for a trainer process holding gigabytes
    (``fork`` copies the page tables). None when either tool is missing.
    """
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if setpriv is None or prlimit is None:
        return None
    argv = [setpriv, "--pdeathsig=KILL"]
    if uid is not None and gid is not None:
        argv += [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    argv += ["--", prlimit]
    rows: tuple[tuple[str, int, int | None, int | None], ...] = (
        ("--as", resource.RLIMIT_AS, limits.address_space_bytes, None),
        ("--cpu", resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 1),
        ("--fsize", resource.RLIMIT_FSIZE, limits.file_size_bytes, None),
        ("--nproc", resource.RLIMIT_NPROC, limits.processes, None),
        ("--nofile", resource.RLIMIT_NOFILE, limits.open_files, None),
        ("--core", resource.RLIMIT_CORE, 0, None),
    )
    for flag, which, wanted, wanted_hard in rows:
        if wanted is None:
            continue
        soft, hard = _within_hard_limit(which, wanted, wanted_hard)
        argv.append(f"{flag}={soft}:{hard}")
    return [*argv, "--"]


def make_preexec(limits: Limits, uid: int | None, gid: int | None) -> Callable[[], None]:
    """The function the child runs between fork and exec.

    Limits come first (setting them needs no privilege), then the switch to the unprivileged
    uid (RLIMIT_NPROC is not enforced for uid 0), then the death signal, which must follow the
    uid switch because changing credentials clears it.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        _set(resource.RLIMIT_AS, limits.address_space_bytes)
        _set(resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 1)
        _set(resource.RLIMIT_FSIZE, limits.file_size_bytes)
        if limits.processes is not None:
            _set(resource.RLIMIT_NPROC, limits.processes)
        _set(resource.RLIMIT_NOFILE, limits.open_files)
        _set(resource.RLIMIT_CORE, 0)
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)

    return preexec


def _within_hard_limit(which: int, soft: int, hard: int | None = None) -> tuple[int, int]:
    hard = soft if hard is None else hard
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    return soft, hard


def _set(which: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(which, _within_hard_limit(which, soft, hard))
