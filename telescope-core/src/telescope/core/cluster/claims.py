"""Machine-wide claims between Telescope runs: ports and private Ray clusters.

Two runs on one machine must not pick the same inference ports (both probe 8100 free
before either server binds it) nor join each other's private Ray cluster. A claim is an
``flock`` on a small file under ``$TMPDIR/telescope-<uid>/``, held for the run's life; the
kernel drops it when the process dies, so a crashed run never blocks the next one.

The folder is private: created 0700 (an existing one of ours is made 0700), refused when it
is a symlink or another user owns it, and every claim file is opened without following a symlink (``O_NOFOLLOW``), so a file
planted in a shared ``/tmp`` can neither redirect a run's writes nor be truncated by them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import random
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "RENDEZVOUS_LEASE_S",
    "Claim",
    "ClaimsDirError",
    "claim",
    "claim_holder",
    "claims_dir",
    "port_block",
    "port_free",
    "release_rendezvous_ports",
    "rendezvous_port",
]


class ClaimsDirError(RuntimeError):
    """The claims folder is not private to this user (see the module docstring)."""


def claims_dir(kind: str) -> Path:
    """``$TMPDIR/telescope-<uid>/<kind>`` (created, private to this user)."""
    root = Path(tempfile.gettempdir()) / f"telescope-{os.getuid()}"
    for path in (root, root / kind):
        _private_dir(path)
    return root / kind


def _private_dir(path: Path) -> None:
    """Create ``path`` 0700, or check that an existing one is a real folder of ours (then made 0700)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder (a symlink or a file)"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    elif info.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, from an older release or a loose umask: make it private
    if problem:
        raise ClaimsDirError(
            f"Telescope's claims folder {path} {problem}: another user may be trying to interfere with "
            f"this run's port and cluster claims; remove it (or set TMPDIR to a private folder) and retry"
        )


def _open_claim_file(path: Path, mode: str) -> IO[str]:
    """Open a claim file for ``mode`` ('a+', 'a' or 'r') without following a symlink, created 0600."""
    flags = {
        "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
        "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "r": os.O_RDONLY,
    }[mode]
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ClaimsDirError(f"claim file {path} is a symlink: remove it and retry") from None
        raise
    return open(fd, mode, encoding="utf-8")


def _file(kind: str, name: str) -> Path:
    return claims_dir(kind) / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".lock")


class Claim:
    """A held claim; ``release`` (or process exit) frees it."""

    def __init__(self, handle: IO[str], path: Path) -> None:
        self._handle: IO[str] | None = handle
        self.path = path

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.truncate(0)
                fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def claim(kind: str, name: str, info: dict[str, Any]) -> Claim | None:
    """Claim ``name`` of ``kind`` for this process (``info`` is what others see); None if a live run holds it."""
    path = _file(kind, name)
    handle = _open_claim_file(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), **info}))
    handle.flush()
    return Claim(handle, path)


def claim_holder(kind: str, name: str) -> dict[str, Any] | None:
    """What the live run holding ``name`` recorded, or None when no live run holds it."""
    path = _file(kind, name)
    if not path.exists():
        return None
    with _open_claim_file(path, "r") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(handle.read() or "{}")
            except ValueError:
                data = {}
            return data if isinstance(data, dict) else {}
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_block(
    host: str, base: int, count: int, info: dict[str, Any], tries: int = 200
) -> tuple[int, list[Claim]]:
    """The first block ``base + k*count ..`` (k = 0, 1, ..) of ``count`` ports that are free and claimed
    by no other live run; returns its first port and the claims (hold them until the servers stop)."""
    for k in range(tries):
        first = base + k * count
        if first + count - 1 > 65535:
            break
        claims: list[Claim] = []
        for port in range(first, first + count):
            free = port_free(host, port) and not _rendezvous_claimed(port)  # a store may bind it soon
            held = claim("ports", str(port), info) if free else None
            if held is None:
                break
            claims.append(held)
        if len(claims) == count:
            return first, claims
        for held in claims:
            held.release()
    raise RuntimeError(
        f"no block of {count} free inference ports from inference_base_port {base} up; set inference_base_port "
        "to a free range"
    )


# Above Ray's default worker ports (10002-19999); the top is the kernel's ephemeral range start.
_QUIET_LOW = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: A rendezvous claim whose owner is on another machine (its pid cannot be checked) lapses after
#: this long; the store binds its port within seconds, after which the port is no longer free anyway.
RENDEZVOUS_LEASE_S = 600.0
_RENDEZVOUS = "rendezvous"


def rendezvous_port(host: str = "0.0.0.0", tries: int = 200, owner: dict[str, Any] | None = None) -> int:
    """A port for a store that a process started later binds (trainer rendezvous, weight-sync store).

    Not one the kernel picks (``bind(0)``): that is in the ephemeral range, which every outgoing
    connection on the machine draws from, so on a busy node another socket can take it in the
    seconds before the store binds (seen: ``EADDRINUSE`` at the trainer's rendezvous). A random
    free port between Ray's worker ports and the ephemeral range, skipping the ports other live
    runs claimed for their servers and for their stores; the kernel's choice only when none is found.

    The pick is claimed at once (checked and recorded under a lock, so two runs picking at the same
    moment get different ports) for ``owner`` (``{"pid", "host"}``: the run's driver; default this
    process); ``release_rendezvous_ports`` removes the owner's claims when its run ends, and a claim
    whose owner died, or older than ``RENDEZVOUS_LEASE_S``, is taken over.
    """
    high = _ephemeral_low()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), **(owner or {})}
    for _ in range(tries if high > _QUIET_LOW + 100 else 0):
        port = random.randrange(_QUIET_LOW, high)
        if claim_holder("ports", str(port)) is None and port_free(host, port) and _claim_port(port, holder):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _rendezvous_claimed(port: int) -> bool:
    """Whether a live run claimed ``port`` for a store it has not bound yet."""
    path = claims_dir(_RENDEZVOUS) / f"{port}.claim"
    return path.exists() and not _stale(path)


def _claim_port(port: int, holder: dict[str, Any]) -> bool:
    """Claim rendezvous ``port`` for ``holder``; False when a live claim holds it. Checked and written
    under the claims directory's lock, so of two processes picking the same port only one gets it."""
    path = claims_dir(_RENDEZVOUS) / f"{port}.claim"
    with _rendezvous_lock():
        if path.exists() and not _stale(path):
            return False
        path.write_text(json.dumps({**holder, "time": time.time()}), encoding="utf-8")
        return True


@contextlib.contextmanager
def _rendezvous_lock() -> Iterator[None]:
    with _open_claim_file(claims_dir(_RENDEZVOUS) / "claims.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for a few file operations; dropped on exit or death
        yield


def _stale(path: Path) -> bool:
    """Whether the claim in ``path`` no longer holds: its owner on this machine died, it is older than
    the lease, or it is not a claim at all (unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    if not isinstance(data, dict) or not isinstance(data.get("time"), int | float):
        return True
    if time.time() - data["time"] > RENDEZVOUS_LEASE_S:
        return True
    if not isinstance(data.get("pid", 0), int):
        return True
    return data.get("host") == socket.gethostname() and not _alive(data.get("pid", 0))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def release_rendezvous_ports(pid: int | None = None) -> list[int]:
    """Remove this machine's rendezvous claims of ``pid`` (default: this process), at the end of its run;
    returns their ports."""
    pid, host, released = os.getpid() if pid is None else pid, socket.gethostname(), []
    with _rendezvous_lock():
        for path in claims_dir(_RENDEZVOUS).glob("*.claim"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("pid") == pid and data.get("host") == host:
                path.unlink()
                released.append(int(path.name.split(".")[0]))
    return sorted(released)
