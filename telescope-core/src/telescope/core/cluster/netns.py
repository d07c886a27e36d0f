"""A private network namespace for a single-machine run: nothing the run listens on is reachable
from outside it.

Ray's gRPC servers (GCS, raylet, the dashboard and runtime-env agents, one per worker) bind every
interface whatever address Ray is given, and Ray has no setting that changes it. So a run that
starts its own private Ray cluster re-runs itself inside a new user + network namespace
(``unshare``) whose only link to the outside is pasta's user-mode network (the ``passt`` package):
outbound connections (the Hugging Face hub, W&B, cloud sandboxes) work as before, and no port of
the namespace is forwarded to the host (``-t none -u none``), so Ray's ports, the inference servers,
the weight-sync stores and the agent gateway answer only processes of the run itself. Nothing the
other way either: no host port is forwarded in (``-T none -U none``) and pasta's gateway address
is not mapped to the host's loopback (``--no-map-gw``), so the host's loopback-only services are
out of the run's reach. The user's id stays the same inside (``--map-current-user``; root maps
every uid, so a sandbox's uid exists inside); GPUs, files and the run directory are untouched.

``auto`` uses the namespace when the run starts a private cluster, listens on loopback only and the
tools work here, and otherwise says once why it does not; ``required`` fails instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from telescope.core.config import ConfigError

__all__ = [
    "INSIDE_ENV",
    "NamespacePlan",
    "NetworkNamespaceError",
    "plan_namespace",
    "run_inside",
]

log = logging.getLogger("telescope.cluster")

NamespaceMode = Literal["auto", "required", "off"]

INSIDE_ENV = "TELESCOPE_NETNS"
"""Set (to ``1``) in the environment of a run re-started inside its private namespace."""

_GO, _GIVE_UP = b"g", b"x"
_SETUP_TIMEOUT_S = 30.0


class NetworkNamespaceError(ConfigError):
    """The private network namespace cannot be made here (and ``ray_network_namespace`` requires it)."""


@dataclass(frozen=True)
class NamespacePlan:
    """Whether a run re-starts inside a private network namespace, and why (or why not)."""

    use: bool
    reason: str


def missing_tools() -> list[str]:
    """The programs the namespace needs that are not on PATH (``unshare``: util-linux; ``pasta``:
    the ``passt`` package)."""
    return [tool for tool in ("unshare", "pasta") if shutil.which(tool) is None]


def plan_namespace(
    mode: NamespaceMode, *, private_cluster: bool, open_listeners: list[str], inside: bool | None = None
) -> NamespacePlan:
    """Decide for one run. ``open_listeners`` names the config fields that ask for a non-loopback
    listener (the user wants those reachable from other hosts, which a private namespace would stop)."""
    inside = os.environ.get(INSIDE_ENV) == "1" if inside is None else inside
    if inside:
        return NamespacePlan(False, "already inside the run's private network namespace")
    if mode == "off":
        return NamespacePlan(False, "ray_network_namespace: off")
    why_not = _why_not(private_cluster, open_listeners)
    if why_not and mode == "required":
        raise NetworkNamespaceError(
            f"ray_network_namespace: required, but {why_not}; set ray_network_namespace: auto to run "
            "without it (Ray's ports then listen on every interface, token-protected)"
        )
    return NamespacePlan(not why_not, why_not or "private Ray cluster on this machine")


def _why_not(private_cluster: bool, open_listeners: list[str]) -> str:
    if not private_cluster:
        return "the run joins a Ray cluster started outside it (secure that cluster: docs/security.md)"
    if open_listeners:
        return f"{', '.join(open_listeners)} ask(s) for listeners other hosts reach"
    missing = missing_tools()
    if missing:
        packages = {"unshare": "util-linux", "pasta": "passt"}
        return f"{' and '.join(missing)} not found: install {' and '.join(packages[t] for t in missing)}"
    return ""


def run_inside(argv: list[str]) -> int:
    """Run ``argv`` (this command again) inside a new user + network namespace with pasta's outbound
    network; return its exit status. Raises ``NetworkNamespaceError`` when the namespace cannot be
    set up (user namespaces disabled, pasta failing): nothing of the run has started then."""
    ready_r, ready_w = os.pipe()  # the child says "I am inside" with its pid
    go_r, go_w = os.pipe()  # we say "the network is up" (or give up)
    # root maps every uid (the parent writes the map, below): a sandbox's uid 65534 exists inside
    as_root = os.geteuid() == 0
    namespaces = ("--user", "--net") if as_root else ("--user", "--map-current-user", "--net")
    child = subprocess.Popen(
        [
            *("unshare", *namespaces, "--fork", "--kill-child"),
            *(sys.executable, "-m", "telescope.core.cluster.netns", str(ready_w), str(go_r), "--", *argv),
        ],
        pass_fds=(ready_w, go_r),
        preexec_fn=_die_with_parent,
    )
    os.close(ready_w)
    os.close(go_r)
    try:
        inner_pid = _read_pid(ready_r, child)
        if as_root:
            _map_every_id(inner_pid)
        pasta = _start_pasta(inner_pid)
    except BaseException:
        os.write(go_w, _GIVE_UP)
        child.wait()
        raise
    finally:
        os.close(ready_r)
    try:
        os.write(go_w, _GO)
        os.close(go_w)
        return _wait_forwarding_signals(child, inner_pid)
    finally:
        _stop(pasta)


def _read_pid(ready_r: int, child: subprocess.Popen[bytes]) -> int:
    import select

    readable, _, _ = select.select([ready_r], [], [], _SETUP_TIMEOUT_S)
    data = os.read(ready_r, 32) if readable else b""
    if not data.strip():
        code = child.poll()
        raise NetworkNamespaceError(
            "could not create a user + network namespace (`unshare --user --map-current-user --net` "
            f"{'exited ' + str(code) if code is not None else 'did not answer'}): user namespaces may "
            "be disabled here (sysctl kernel.unprivileged_userns_clone, "
            "kernel.apparmor_restrict_unprivileged_userns, a container's seccomp profile), or unshare "
            "predates --map-current-user (util-linux < 2.38)"
        )
    pid = int(data.strip())
    if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        raise NetworkNamespaceError(f"process {pid} is not in a new network namespace")
    return pid


def _start_pasta(pid: int) -> subprocess.Popen[bytes]:
    """pasta joins ``pid``'s namespaces, gives them a network interface with the host's addresses and
    routes, and forwards no port in either direction, nor its gateway address to the host's loopback
    (``--no-map-gw``: by default pasta answers connections to the gateway from the host's 127.0.0.1,
    and every loopback-only service of the host would be the run's). It runs in the foreground as
    our child (a daemon pasta outlives the namespace) in its own session (Ctrl-C is for the run, not
    the network), and dies with us (``PR_SET_PDEATHSIG``); ready once the namespace has a default
    route."""
    command = [
        "pasta",
        "--foreground",
        "--config-net",
        "--quiet",
        *("-t", "none", "-u", "none", "-T", "none", "-U", "none"),
        "--no-map-gw",
    ]
    if os.geteuid() == 0:
        command += ["--runas", "0"]  # pasta drops root to nobody, who may not enter root's namespace
    errors = tempfile.TemporaryFile()
    pasta = subprocess.Popen(
        [*command, str(pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errors,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    while not _has_default_route(pid):
        if pasta.poll() is not None or time.monotonic() > deadline:
            _stop(pasta)
            errors.seek(0)
            raise NetworkNamespaceError(
                f"pasta could not connect the run's network namespace (exit {pasta.returncode}): "
                f"{errors.read().decode(errors='replace').strip()[-300:]}"
            )
        time.sleep(0.02)
    errors.close()
    return pasta


def _map_every_id(pid: int) -> None:
    """Map every uid and gid of the host to itself in ``pid``'s new user namespace (root may): the
    run keeps its users, so the ``local`` sandboxes' uid (65534) exists inside."""
    try:
        for kind in ("uid", "gid"):
            Path(f"/proc/{pid}/{kind}_map").write_text("0 0 4294967295\n")
    except OSError as exc:
        raise NetworkNamespaceError(
            f"root could not map the host's users into the run's user namespace ({exc}): "
            "it needs CAP_SETUID and CAP_SETGID; set ray_network_namespace: off to run without it"
        ) from None


def _default_routes(pid: int | str) -> frozenset[str]:
    """The address families (``ipv4``, ``ipv6``) with a default route in ``pid``'s network namespace."""
    try:
        routes = Path(f"/proc/{pid}/net/route").read_text().splitlines()[1:]
        routes6 = Path(f"/proc/{pid}/net/ipv6_route").read_text().splitlines()
    except OSError:
        return frozenset()
    default6 = "0" * 32 + " 00"
    families = {"ipv4"} if any(line.split()[1] == "00000000" for line in routes) else set()
    if any(r.startswith(default6) for r in routes6):
        families.add("ipv6")
    return frozenset(families)


def _has_default_route(pid: int) -> bool:
    """Whether pasta has finished routing ``pid``'s namespace: a default route for every family the
    host has one for (pasta configures them one by one; a loaded machine showed IPv6 routed while IPv4
    was not yet), or any default route when the host has none."""
    inside = _default_routes(pid)
    return bool(inside) and _default_routes("self") <= inside


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_forwarding_signals(child: subprocess.Popen[bytes], run_pid: int) -> int:
    """Wait for the run; SIGTERM/SIGHUP go on to the run itself (``run_pid``: ``unshare`` ignores
    them). Ctrl-C reaches the run from the terminal (same process group), so this process only
    ignores SIGINT and waits for the run to stop cleanly."""

    def forward_signal(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(run_pid, sig)

    forward = {signal.SIGTERM, signal.SIGHUP}
    previous = {sig: signal.signal(sig, forward_signal) for sig in forward}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _die_with_parent() -> None:
    """The namespace (and the run in it) ends with the command that started it, even on SIGKILL."""
    pr_set_pdeathsig = 1  # SIGKILL: unshare ignores SIGTERM (--kill-child then ends the run)
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _enter(ready_fd: int, go_fd: int, argv: list[str]) -> None:
    """Inside the namespace: report our pid, wait for the network, then become the run."""
    os.write(ready_fd, str(os.getpid()).encode())
    os.close(ready_fd)
    answer = os.read(go_fd, 1)
    os.close(go_fd)
    if answer != _GO:
        sys.exit(3)
    os.environ[INSIDE_ENV] = "1"
    os.execv(argv[0], argv)


if __name__ == "__main__":  # python -m telescope.core.cluster.netns READY_FD GO_FD -- ARGV...
    _enter(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:])
