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


def _listening() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in LISTEN state."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
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


def _sample(pids: set[int], seen: dict[tuple[int, str, int], str], cmdlines: dict[int, str]) -> None:
    listening = _listening()
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
    config.write_text(yaml.safe_dump(settings(run_dir, number_of_steps=4)))
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
