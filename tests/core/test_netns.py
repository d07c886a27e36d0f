"""The private network namespace a single-machine run re-runs itself in (``cluster.netns``)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from telescope.core.cluster import netns
from telescope.core.config import ConfigError


@pytest.fixture
def tools_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "missing_tools", lambda: [])


@pytest.mark.parametrize(
    ("mode", "private", "open_listeners", "inside", "use"),
    [
        ("auto", True, [], False, True),
        ("required", True, [], False, True),
        ("off", True, [], False, False),
        ("auto", False, [], False, False),  # a cluster started with `ray start`: its network, its rules
        ("auto", True, ["inference_host 0.0.0.0"], False, False),  # the user wants servers reachable
        ("auto", True, [], True, False),  # the re-started run itself
    ],
)
def test_the_plan_uses_a_namespace_only_for_a_private_cluster_listening_on_loopback(
    tools_present: None,
    mode: netns.NamespaceMode,
    private: bool,
    open_listeners: list[str],
    inside: bool,
    use: bool,
) -> None:
    plan = netns.plan_namespace(mode, private_cluster=private, open_listeners=open_listeners, inside=inside)
    assert plan.use is use
    assert plan.reason


def test_required_names_why_it_cannot_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "missing_tools", lambda: ["pasta"])
    with pytest.raises(ConfigError, match=r"ray_network_namespace: required.*pasta not found: install passt"):
        netns.plan_namespace("required", private_cluster=True, open_listeners=[], inside=False)
    plan = netns.plan_namespace("auto", private_cluster=True, open_listeners=[], inside=False)
    assert not plan.use and "pasta not found" in plan.reason
    with pytest.raises(ConfigError, match="inference_host 0.0.0.0"):
        netns.plan_namespace(
            "required", private_cluster=True, open_listeners=["inference_host 0.0.0.0"], inside=False
        )


def _unusable() -> str | None:
    if netns.missing_tools():
        return f"{netns.missing_tools()} not installed"
    probe = subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"], capture_output=True)
    return f"no user namespaces here: {probe.stderr.decode()[-200:]}" if probe.returncode else None


def _pasta_processes() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().startswith(("pasta", "passt")):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


needs_namespaces = pytest.mark.skipif(bool(_unusable()), reason=str(_unusable()))


@needs_namespaces
def test_the_command_runs_in_a_new_network_namespace_with_a_routed_interface_and_its_exit_status(
    tmp_path: Path,
) -> None:
    report = tmp_path / "inside.txt"
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        links = sorted(p.name for p in pathlib.Path("/sys/class/net").iterdir())
        route = pathlib.Path("/proc/net/route").read_text().splitlines()[1:]
        pathlib.Path({str(report)!r}).write_text(
            "\\n".join([os.readlink("/proc/self/ns/net"), str(os.getuid()), os.environ["{netns.INSIDE_ENV}"],
                       ",".join(links), str(len(route))]))
        sys.exit(7)
        """
    )
    pastas = _pasta_processes()
    assert netns.run_inside([sys.executable, "-c", script]) == 7
    assert _pasta_processes() == pastas  # the namespace's network helper ended with the run
    ns, uid, mark, links, routes = report.read_text().splitlines()
    assert ns != os.readlink("/proc/self/ns/net")
    assert uid == str(os.getuid())  # --map-current-user: the same user inside
    assert mark == "1"
    assert "lo" in links.split(",") and len(links.split(",")) >= 2  # pasta's interface beside loopback
    assert int(routes) >= 1


@needs_namespaces
def test_sigterm_to_the_starting_command_reaches_the_run_inside(tmp_path: Path) -> None:
    got = tmp_path / "got-signal"
    started = tmp_path / "started"
    inner = textwrap.dedent(
        f"""
        import pathlib, signal, sys, time
        def stop(sig, frame):
            pathlib.Path({str(got)!r}).write_text(str(sig))
            sys.exit(5)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path({str(started)!r}).write_text("")
        time.sleep(60)
        """
    )
    outer = f"import sys; from telescope.core.cluster import netns; sys.exit(netns.run_inside([sys.executable, '-c', {inner!r}]))"
    proc = subprocess.Popen([sys.executable, "-c", outer])
    deadline = time.time() + 30
    while not started.exists():
        assert proc.poll() is None and time.time() < deadline, "the run inside never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 5
    assert got.read_text() == str(int(signal.SIGTERM))


PROBE = Path(__file__).with_name("loopback_probe.py")


def load_probe() -> Any:
    """tests/core/loopback_probe.py as a module (the host side: its listener, the host's addresses)."""
    spec = importlib.util.spec_from_file_location("loopback_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_namespaces
def test_no_address_inside_the_namespace_reaches_a_loopback_only_service_of_the_host(tmp_path: Path) -> None:
    """pasta maps its gateway address (192.0.2.1 / the host's gateway) to the host's 127.0.0.1
    unless told not to (--no-map-gw): a loopback-only listener then served the whole run."""
    probe = load_probe()
    listener = probe.LoopbackListener()
    host_addresses = list(probe.seen_addresses())
    report = tmp_path / "report.json"
    try:
        inner = f"import runpy, sys; sys.stdout = open({str(report)!r}, 'w'); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        args = [str(PROBE), str(listener.port), *host_addresses]
        assert netns.run_inside([sys.executable, "-c", inner, *args]) == 0
    finally:
        accepted = listener.close()
    seen = json.loads(report.read_text())
    assert seen["gateways"], seen  # pasta's routes: the addresses it used to map to the host
    tried = {*seen["gateways"], "127.0.0.1", "::1", "::ffff:127.0.0.1", "10.0.2.2", *host_addresses}
    assert tried <= set(seen["tried"])
    assert seen["reached"] == [], seen
    assert accepted == []


def _host_nameserver() -> str | None:
    for line in (
        Path("/etc/resolv.conf").read_text().splitlines() if Path("/etc/resolv.conf").exists() else []
    ):
        if line.startswith("nameserver"):
            return line.split()[1]
    return None


@needs_namespaces
def test_outbound_connections_still_leave_the_namespace(tmp_path: Path) -> None:
    """Where the host reaches its DNS server over TCP, a process inside the namespace does too."""
    server = _host_nameserver()
    try:
        socket.create_connection((server or "", 53), timeout=3).close()
    except OSError as exc:
        pytest.skip(f"the host itself has no outbound TCP to its nameserver {server}: {exc}")
    code = f"import socket; socket.create_connection(({server!r}, 53), timeout=5).close()"
    assert netns.run_inside([sys.executable, "-c", code]) == 0


@needs_namespaces
def test_root_keeps_every_user_inside_so_a_sandbox_uid_exists(tmp_path: Path) -> None:
    """A root run maps every uid to itself (a ``local`` sandbox runs as 65534 and chowns its
    workspace to it); anyone else maps only their own uid."""
    target = tmp_path / "owned"
    target.write_text("")
    code = f"import os; os.chown({str(target)!r}, 65534, 65534); print(open('/proc/self/uid_map').read())"
    status = netns.run_inside([sys.executable, "-c", code])
    if os.geteuid() == 0:
        assert status == 0 and target.stat().st_uid == 65534
    else:
        assert status != 0 and target.stat().st_uid == os.getuid()  # not root: no chown to others


@pytest.mark.parametrize(
    ("host", "inside", "ready"),
    [
        ({"ipv4", "ipv6"}, {"ipv6"}, False),  # pasta routed IPv6 first: IPv4 not yet (seen under load)
        ({"ipv4", "ipv6"}, {"ipv4", "ipv6"}, True),
        ({"ipv4"}, {"ipv4"}, True),
        (set(), {"ipv4"}, True),  # a host without a default route: any route inside will do
        (set(), set(), False),
    ],
)
def test_the_namespace_is_ready_once_every_family_the_host_routes_is_routed(
    monkeypatch: pytest.MonkeyPatch, host: set[str], inside: set[str], ready: bool
) -> None:
    routes = {"self": frozenset(host), 4242: frozenset(inside)}
    monkeypatch.setattr(netns, "_default_routes", lambda pid: routes[pid])
    assert netns._has_default_route(4242) is ready
