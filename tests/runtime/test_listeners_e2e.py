"""What a real single-machine run opens on the network (closed-by-default issue, "done when": ``ss``
during a run shows no non-loopback listener of Telescope's own).

A real ``telescope train`` (Ray, one FSDP rank, one transformers server, the tiny model) is sampled
while it trains: every TCP socket in LISTEN state held by one of its processes (read from
``/proc/<pid>/fd`` and ``/proc/net/tcp{,6}``, what ``ss -ltnp`` shows). Ray 2.60 binds its gRPC servers
on every interface whatever address it is given (no option turns that off; docs/security.md): those
are allowed, and only those — Ray's system processes, and in each Ray worker the one gRPC port of
its core worker. Everything Telescope opens (inference servers, the trainer rendezvous and weight-sync
stores) must listen on loopback. The run's secret, given to the run in its environment, must appear
in no command line and no file of the run directory.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch, settings

pytest.importorskip("ray")

SECRET = "listener-probe-" + "e" * 48

#: Ray's own processes, by /proc/<pid>/comm or a part of their (rewritten) command line.
RAY_SYSTEM = (
    "gcs_server",
    "raylet",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray/dashboard/agent.py",
    "ray/dashboard/dashboard.py",
    "runtime_env/agent/main.py",
    "ray/autoscaler/_private/monitor.py",
    "log_monitor.py",
)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6} local address (little-endian words) -> text."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def _listening(net: str = "/proc/self/net") -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in LISTEN state in the network namespace
    whose ``/proc/<pid>/net`` is ``net`` (this process's own by default: what ``ss`` shows here)."""
    out = {}
    for table in (f"{net}/tcp", f"{net}/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                addr, port = fields[1].split(":")
                out[fields[9]] = (_address(addr), int(port, 16))
    return out


def _describe(pid: int) -> tuple[str, str]:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "", ""
    return comm, cmdline


def _sample(
    pids: set[int],
    seen: dict[tuple[int, str, int], str],
    cmdlines: dict[int, str],
    listening: dict[str, tuple[str, int]] | None = None,
) -> None:
    listening = _listening() if listening is None else listening
    for pid in pids:
        comm, cmdline = _describe(pid)
        if cmdline:
            cmdlines[pid] = cmdline
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else None
            if inode in listening:
                addr, port = listening[inode]
                seen[(pid, addr, port)] = f"{comm} | {cmdline[:160]}"


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


@pytest.mark.slow
def test_a_single_machine_run_listens_beyond_loopback_only_with_rays_authenticated_grpc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELESCOPE_RUN_SECRET", SECRET)
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    # without the private network namespace: what Ray and Telescope open on the host's network
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=4, ray_network_namespace="off")))
    proc = launch(config, log)
    seen: dict[tuple[int, str, int], str] = {}
    cmdlines: dict[int, str] = {}
    server_seen = False
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        _sample(_descendants(proc.pid), seen, cmdlines)
        server_seen |= any("transformers_engine.server" in c for c in cmdlines.values())
        time.sleep(0.5)
    assert finish(proc, log, 60) == 0, log.read_text()[-3000:]
    assert server_seen, "the inference server process was never seen: the sampling missed the run"

    outside = {key: what for key, what in seen.items() if not _loopback(key[1])}
    by_pid: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for pid, addr, port in outside:
        by_pid[pid].append((addr, port))
    table = "\n".join(
        f"{addr}:{port} pid {pid}: {seen[(pid, addr, port)]}" for pid, addr, port in sorted(outside)
    )
    for pid, sockets in by_pid.items():
        what = seen[(pid, *sockets[0])]
        if any(name in what for name in RAY_SYSTEM):
            continue
        # a Ray worker or the driver (a Ray core worker too): its core worker's gRPC server is the one
        # socket Ray opens in it beyond loopback; a second one would be Telescope's
        core_worker = pid == proc.pid or "ray::" in what or "default_worker.py" in what
        assert core_worker, f"not Ray's, yet not on loopback:\n{table}"
        assert len(sockets) == 1, (
            f"a Ray core worker listens beyond loopback on more than its gRPC port:\n{table}"
        )
    # the inference server processes (no Ray in them) listen on loopback only
    servers = {key: what for key, what in seen.items() if "telescope.core.inference" in what}
    assert servers, f"the inference server's listener was never seen:\n{seen}"
    assert all(_loopback(addr) for _, addr, _ in servers), servers

    # the secret travelled in the environment only
    assert not [c for c in cmdlines.values() if SECRET in c]
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == [] and SECRET not in log.read_text()


def _namespace_unusable() -> str | None:
    from telescope.core.cluster.netns import missing_tools

    if missing_tools():
        return f"{' and '.join(missing_tools())} not installed"
    probe = subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"], capture_output=True)
    return f"no user namespaces here: {probe.stderr.decode()[-200:]}" if probe.returncode else None


def _host_address() -> str | None:
    """The address other hosts reach this one by (the source address of its default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            return str(probe.getsockname()[0])
        except OSError:
            return None


def _refused_from_here(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.slow
def test_a_single_machine_run_in_its_private_network_namespace_listens_on_nothing_outside_it(
    tmp_path: Path,
) -> None:
    """``ray_network_namespace: auto`` (the default): the host's table (``ss``) holds no listener of the
    run beyond loopback; the run's own namespace holds Ray's every-interface ports, and they refuse a
    connection from the host at its address."""
    if reason := _namespace_unusable():
        pytest.skip(reason)
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=4)))
    proc = launch(config, log)
    here = os.readlink("/proc/self/ns/net")
    on_host: dict[tuple[int, str, int], str] = {}
    inside: dict[tuple[int, str, int], str] = {}
    cmdlines: dict[int, str] = {}
    namespaces: dict[str, str] = {}  # process -> its network namespace
    reachable: list[str] = []
    address = _host_address()
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        pids = _descendants(proc.pid)
        _sample(pids, on_host, cmdlines)
        for pid in pids:
            try:
                netns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            namespaces[_describe(pid)[0]] = netns
            if netns != here:
                before = set(inside)
                try:
                    tables = _listening(f"/proc/{pid}/net")
                except OSError:  # the process just ended
                    continue
                _sample({pid}, inside, cmdlines, tables)
                host_ports = {port for _, port in _listening().values()}
                for key in set(inside) - before:
                    if address and not _loopback(key[1]) and key[2] not in host_ports:
                        if not _refused_from_here(address, key[2]):
                            reachable.append(f"{address}:{key[2]} ({inside[key]})")
        time.sleep(0.5)
    assert finish(proc, log, 60) == 0, log.read_text()[-3000:]

    outside = sorted(key for key in on_host if not _loopback(key[1]))
    assert outside == [], f"listeners of the run on the host's network: {outside}"
    assert namespaces.get("raylet") and namespaces["raylet"] != here, namespaces
    assert any("transformers_engine.server" in c for c in cmdlines.values()), "the server was never seen"
    ray_wildcards = [what for (_, addr, _), what in inside.items() if not _loopback(addr)]
    assert any("raylet" in what or "gcs_server" in what for what in ray_wildcards), inside
    assert reachable == [], f"reached from the host: {reachable}"
