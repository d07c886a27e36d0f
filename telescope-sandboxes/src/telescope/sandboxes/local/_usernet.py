"""Outbound-only network for a sandbox: its own network namespace behind slirp4netns.

``network_access: true`` must not mean the host's network namespace: code sharing it reaches every
service on the host's loopback (the inference servers, Ray, the dashboard). Instead bubblewrap
creates a fresh namespace (``--unshare-net``) and stops before running the command
(``--block-fd``); slirp4netns gives that namespace a NAT-ed tap device with user-mode networking
(``--disable-host-loopback``: the host's 127.0.0.1 is not reachable through the gateway either),
and the command starts once the device is up. slirp4netns exits with the command (``--exit-fd``).

slirp4netns opens ``/dev/net/tun`` inside the sandbox's namespaces, as the uid it runs as (the
sandbox's under root). Where that uid may not open it (a host whose device is ``crw-------``
root's), root with CAP_SYS_ADMIN runs slirp4netns as root instead, confined by its own
``--enable-sandbox`` (an empty root, every capability dropped but CAP_NET_BIND_SERVICE) and
``--enable-seccomp``; anyone else is refused at sandbox creation (``slirp_identity``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field

__all__ = ["SLIRP_INSTALL", "TUN_DEVICE", "SlirpIdentity", "TunDeviceError", "UserNet", "slirp4netns_path"]

SLIRP_INSTALL = "install slirp4netns (Debian/Ubuntu: apt-get install slirp4netns; telescope-sandboxes/install-bubblewrap.sh does it)"
#: How long bubblewrap may take to report its child's pid, and slirp4netns to bring the device up.
_START_TIMEOUT_S = 10.0


#: The device slirp4netns opens (a path it hard-codes).
TUN_DEVICE = "/dev/net/tun"
_CAP_SYS_ADMIN = 21


def slirp4netns_path() -> str | None:
    return shutil.which("slirp4netns")


class TunDeviceError(RuntimeError):
    """slirp4netns could not open the tun device here: the sandbox cannot have a network."""


@dataclass(frozen=True)
class SlirpIdentity:
    """Who runs a sandbox's slirp4netns."""

    run_as: int | None
    """The uid it switches to (None: this process's)."""
    confined_root: bool = False
    """Root, because only root may open the tun device here: slirp4netns then confines itself
    (``--enable-sandbox``, ``--enable-seccomp``) once the device is open."""

    @classmethod
    def choose(
        cls, sandbox_uid: int | None, *, device: str | None = None, privileged: bool | None = None
    ) -> SlirpIdentity:
        """The sandbox's uid (``None``: this process's) where it may open ``device`` (default
        ``TUN_DEVICE``), else confined root where this process is root with CAP_SYS_ADMIN
        (``privileged``: detected when None); otherwise raise ``TunDeviceError`` naming the cause
        and the fix."""
        device = device or TUN_DEVICE
        uid = os.geteuid() if sandbox_uid is None else sandbox_uid
        cause = _tun_refusal(device, sandbox_uid)
        if cause is None:
            return cls(sandbox_uid)
        if root_with_cap_sys_admin() if privileged is None else privileged:
            return cls(None, confined_root=True)
        raise TunDeviceError(
            f"local sandbox: network_access=true needs {device} opened as uid {uid} (slirp4netns), "
            f"but {cause}: make it usable by every user, as udev's default rule does (chmod 0666 {device}; "
            "in a container, pass the device with those permissions), run Telescope as root with "
            "CAP_SYS_ADMIN, or set network_access: false"
        )


def _tun_refusal(device: str, sandbox_uid: int | None) -> str | None:
    """Why ``sandbox_uid`` (None: this process) may not open ``device`` read-write, or None."""
    try:
        info = os.stat(device)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror}; load the tun module: modprobe tun)"
    shown = f"it is {stat.filemode(info.st_mode)} uid {info.st_uid} gid {info.st_gid}"
    if sandbox_uid is None:
        return None if os.access(device, os.R_OK | os.W_OK) else shown
    # the sandbox's uid runs with gid = uid and no supplementary groups (setpriv --clear-groups)
    if sandbox_uid == info.st_uid:
        bits = 0o600
    elif sandbox_uid == info.st_gid:
        bits = 0o060
    else:
        bits = 0o006
    return None if info.st_mode & bits == bits else shown


def root_with_cap_sys_admin() -> bool:
    """Root allowed to enter another user's namespaces (not root in a container without it)."""
    if os.geteuid() != 0:
        return False
    try:
        status = open("/proc/self/status", encoding="ascii").read()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> _CAP_SYS_ADMIN & 1)


@dataclass
class UserNet:
    """The pipes between one bubblewrap command and its slirp4netns, and the slirp4netns process."""

    slirp4netns: str
    identity: SlirpIdentity = field(default_factory=lambda: SlirpIdentity(None))
    """Who runs slirp4netns (``SlirpIdentity.choose``)."""
    info_read: int = -1
    info_write: int = -1
    block_read: int = -1
    block_write: int = -1
    process: asyncio.subprocess.Process | None = None
    _exit_write: int = -1
    _closed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.info_read, self.info_write = os.pipe()
        self.block_read, self.block_write = os.pipe()

    def bwrap_args(self) -> list[str]:
        """bubblewrap options: report the child's pid on one pipe, wait for a byte on the other."""
        return ["--info-fd", str(self.info_write), "--block-fd", str(self.block_read)]

    @property
    def child_fds(self) -> tuple[int, int]:
        """The pipe ends the bubblewrap process inherits."""
        return (self.info_write, self.block_read)

    async def attach(self) -> None:
        """After bubblewrap started: give its namespace a network, then let the command run.

        Raises ``RuntimeError`` naming what failed; the caller kills the command then.
        """
        self._close(self.info_write, self.block_read)
        pid = await asyncio.wait_for(asyncio.to_thread(_read_child_pid, self.info_read), _START_TIMEOUT_S)
        # bubblewrap brings the namespace's loopback up before it blocks; configuring tap0 at the
        # same time makes one of the two fail (RTM_NEWADDR), so wait for it.
        await asyncio.to_thread(_wait_for_loopback, pid)
        userns = _owning_userns(pid)
        ready_read, ready_write = os.pipe()
        exit_read, self._exit_write = os.pipe()
        # slirp4netns enters the user namespace that owns the sandbox's network namespace first, as
        # the uid that created it (bubblewrap ran as the sandbox uid): only so may it enter the
        # network namespace (root in a container lacks CAP_SYS_ADMIN over another user's namespaces).
        # That namespace is found from the network namespace itself: with --disable-userns the
        # sandbox's processes move on into a nested user namespace.
        argv = [self.slirp4netns, "--configure", "--mtu=65520", "--disable-host-loopback"]
        if self.identity.confined_root:
            argv += ["--enable-sandbox", "--enable-seccomp"]
        argv += [f"--userns-path=/proc/self/fd/{userns}", "--ready-fd", str(ready_write)]
        argv += ["--exit-fd", str(exit_read), str(pid), "tap0"]
        if self.identity.run_as is not None:
            uid = self.identity.run_as
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(ready_write, exit_read, userns),
            )
        finally:
            for fd in (ready_write, exit_read, userns):
                os.close(fd)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(os.read, ready_read, 1), _START_TIMEOUT_S)
        finally:
            os.close(ready_read)
        if ready != b"1":
            detail = await self._stderr()
            raise RuntimeError(
                f"slirp4netns could not give the sandbox a network: {detail or 'no reason given'}"
            )
        os.write(self.block_write, b"1")
        self._close(self.block_write)

    async def close(self) -> None:
        """Stop slirp4netns (it exits when the exit pipe closes) and close every pipe end."""
        self._close(self.info_read, self.info_write, self.block_read, self.block_write, self._exit_write)
        if self.process is not None and self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 5.0)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    async def _stderr(self) -> str:
        if self.process is None or self.process.stderr is None:
            return ""
        try:
            data = await asyncio.wait_for(self.process.stderr.read(4096), 1.0)
        except TimeoutError:
            return ""
        return data.decode(errors="replace").strip()

    def _close(self, *fds: int) -> None:
        for fd in fds:
            if fd >= 0 and fd not in self._closed:
                self._closed.append(fd)
                os.close(fd)


#: ioctl on a namespace fd: the user namespace that owns it (linux/nsfs.h: _IO(0xb7, 0x1)).
_NS_GET_USERNS = 0xB701


def _wait_for_loopback(pid: int, timeout_s: float = 2.0) -> None:
    """Until ``pid``'s network namespace has 127.0.0.1 (its fib trie lists it), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/net/fib_trie", encoding="ascii", errors="replace") as trie:
                if "127.0.0.1" in trie.read():
                    return
        except OSError:
            return  # gone already: attach fails on its own with a clear message
        time.sleep(0.002)


def _owning_userns(pid: int) -> int:
    """An fd of the user namespace that owns ``pid``'s network namespace."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(net, _NS_GET_USERNS)
    finally:
        os.close(net)


def _read_child_pid(fd: int) -> int:
    """bubblewrap's ``--info-fd`` JSON (``{"child-pid": N, ...}``), read until it is complete."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError):
            continue
    raise RuntimeError(f"bubblewrap ended before reporting its child's pid (got {data[:200]!r})")
