"""The private network namespace a single-machine run re-runs itself in (``cluster.netns``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
