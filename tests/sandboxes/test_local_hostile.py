"""Hostile programs against the ``local`` provider (bubblewrap).

Every case checks three things besides its own expectation: the call returns a result (or a
typed error) within ``timeout + 2`` seconds, the host is unaffected, and no process carrying
the case's marker survives ``destroy``. Network probes target only 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import ExecResult, SandboxConfig, SandboxConfigError, SandboxPathError

from .conftest import processes_with_marker, run

PROJECT_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"


def contained(
    provider: Any, config: SandboxConfig, marker: str, source: str, timeout: float = 5.0
) -> ExecResult:
    """Upload ``source`` as prog.py, run it, destroy the sandbox, check the common guarantees."""

    async def go() -> ExecResult:
        handle = await provider.create(config)
        try:
            await provider.upload_bytes(handle, "prog.py", source.encode())
            started = time.monotonic()
            result = await provider.execute(handle, f"python3 prog.py  # {marker}", timeout=timeout)
            elapsed = time.monotonic() - started
        finally:
            await provider.destroy(handle)
        assert elapsed <= timeout + 2.0, f"execute took {elapsed:.2f}s with timeout {timeout}s"
        return result

    result = run(go())
    assert processes_with_marker(marker) == [], "a sandbox process survived destroy"
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes
    return result


# ---------------------------------------------------------------------------- network
def test_cannot_connect_to_host_loopback(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    result, accepted = _contained_against_host_listener(
        local_provider,
        marked_config,
        marker,
        lambda port: (
            "import socket\n"
            "s = socket.socket(); s.settimeout(1)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
            "except OSError as e:\n    print('refused', e)\n"
        ),
    )
    assert "CONNECTED" not in result.stdout and "refused" in result.stdout
    assert accepted == [None]


def tun_condition() -> str:
    """How this host's /dev/net/tun serves a networked sandbox, judged here from its mode alone:
    ``opens`` (slirp4netns runs as the sandbox's uid: 65534 under root, else this user),
    ``confined-root`` (only root may open it, and this is root with CAP_SYS_ADMIN) or ``refused``."""
    info = os.stat("/dev/net/tun")
    if os.geteuid() != 0:
        return "opens" if os.access("/dev/net/tun", os.R_OK | os.W_OK) else "refused"
    owner, group = info.st_uid == 65534, info.st_gid == 65534  # the sandbox's uid and gid
    bits = 0o600 if owner else 0o060 if group else 0o006
    if info.st_mode & bits == bits:
        return "opens"
    status = Path("/proc/self/status").read_text()
    effective = int(next(x.split()[1] for x in status.splitlines() if x.startswith("CapEff:")), 16)
    return "confined-root" if effective >> 21 & 1 else "refused"  # bit 21: CAP_SYS_ADMIN


def test_network_access_is_outbound_only_never_the_hosts_loopback(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    """network_access: true used to share the host's namespace: code reached 127.0.0.1 services
    (and through Ray's job API, root). Now it gets its own namespace behind slirp4netns, also where
    /dev/net/tun is root's alone (slirp4netns then runs as root, confined: every capability but
    CAP_NET_BIND_SERVICE dropped once the device is open), or a one-line refusal where that cannot be."""
    if shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    config = marked_config.model_copy(update={"network_access": True})
    condition = tun_condition()
    if condition == "refused":
        with pytest.raises(SandboxConfigError, match=r"needs /dev/net/tun opened as uid \d+ .*chmod 0666"):
            run(local_provider.create(config))
        return
    slirps = SlirpWatch()
    try:
        result, accepted = _contained_against_host_listener(
            local_provider,
            config,
            marker,
            lambda port: (
                "import socket\n"
                "print('interfaces', sorted(name for _, name in socket.if_nameindex()))\n"
                f"for host in ('127.0.0.1', '10.0.2.2'):  # this namespace's loopback; slirp4netns's gateway\n"
                "    s = socket.socket(); s.settimeout(1)\n"
                f"    try:\n        s.connect((host, {port})); print('CONNECTED', host)\n"
                "    except OSError as e:\n        print('refused', host, e)\n"
            ),
        )
    finally:
        seen = slirps.stop()
    assert "interfaces ['lo', 'tap0']" in result.stdout, result.stdout + result.stderr
    assert "CONNECTED" not in result.stdout
    assert "refused 127.0.0.1" in result.stdout and "refused 10.0.2.2" in result.stdout
    assert accepted == [None]
    assert seen, "no slirp4netns ran for the sandbox"
    if condition == "confined-root":
        # the long-lived slirp4netns (the one that forwards the sandbox's traffic) holds nothing but
        # CAP_NET_BIND_SERVICE (bit 10) once the device is open
        assert min(caps for _, caps in seen.values()) == 1 << 10, seen
    else:
        assert {uid for uid, _ in seen.values()} == {65534 if os.geteuid() == 0 else os.getuid()}, seen


CORE_TESTS = Path(__file__).resolve().parents[1] / "core"


def load_test_module(name: str) -> Any:
    """A module of tests/core by file (the loopback probe and its listener; the namespace checks)."""
    spec = importlib.util.spec_from_file_location(f"core_{name}", CORE_TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IN_RUN = """
import asyncio, importlib.util, json, sys
from telescope.core.sandbox import SandboxConfig, SandboxConfigError
from telescope.sandboxes.local import LocalSandboxProvider

probe_path, port, report_path, marker, *host_addresses = sys.argv[1:]
spec = importlib.util.spec_from_file_location("probe", probe_path)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
run_addresses = list(probe.seen_addresses())  # the run's namespace: pasta's gateway, its own
run_gateways = list(probe.gateways())

async def main():
    provider = LocalSandboxProvider()
    config = SandboxConfig(network_access=True, memory_mb=512, disk_size_gb=0.05,
                           environment_vars={"TELESCOPE_TEST_MARKER": marker})
    try:
        handle = await provider.create(config)
    except SandboxConfigError as exc:
        return {"refused": str(exc)}
    try:
        await provider.upload_bytes(handle, "prog.py", open(probe_path, "rb").read())
        addresses = " ".join([*host_addresses, *run_addresses])
        result = await provider.execute(handle, f"python3 prog.py {port} {addresses}", timeout=30)
    finally:
        await provider.destroy(handle)
    return {"run_addresses": run_addresses, "run_gateways": run_gateways, "exit": result.exit_code, "stderr": result.stderr,
            **json.loads(result.stdout or "{}")}

open(report_path, "w").write(json.dumps(asyncio.run(main())))
"""


def test_a_networked_sandbox_inside_a_run_reaches_no_loopback_service_of_the_host(
    tmp_path: Path, marker: str
) -> None:
    """A sandbox with network_access: true inside a run's private namespace: its traffic leaves
    through slirp4netns into the run's namespace and through pasta to the host. From there it
    reached the host's loopback through pasta's gateway; it may reach no loopback-only service of
    the host by any address it or the run can see."""
    netns_tests = load_test_module("test_netns")
    if netns_tests._unusable() or shutil.which("slirp4netns") is None or shutil.which("bwrap") is None:
        pytest.skip(f"needs unshare, pasta, bwrap and slirp4netns: {netns_tests._unusable()}")
    from telescope.core.cluster import netns

    probe = load_test_module("loopback_probe")
    listener = probe.LoopbackListener()
    host_addresses = list(probe.seen_addresses())
    report = tmp_path / "report.json"
    argv = [sys.executable, "-c", IN_RUN, str(probe.__file__), str(listener.port), str(report), marker]
    try:
        assert netns.run_inside([*argv, *host_addresses]) == 0
    finally:
        accepted = listener.close()
    seen = json.loads(report.read_text())
    assert processes_with_marker(marker) == []
    if tun_condition() == "refused":
        assert "needs /dev/net/tun" in seen["refused"]
        return
    assert seen["exit"] == 0, seen
    assert seen["gateways"] == ["10.0.2.2"], seen  # slirp4netns's: the run's namespace behind it
    tried = {"127.0.0.1", "10.0.2.2", "::ffff:127.0.0.1", *host_addresses, *seen["run_addresses"]}
    assert tried <= set(seen["tried"]), seen
    assert seen["run_gateways"], seen  # pasta's routes: what it used to map to the host's loopback
    assert seen["reached"] == [], seen
    assert accepted == []


class SlirpWatch:
    """Records the uid and effective capabilities last seen of every slirp4netns this process starts."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            for entry in Path("/proc").iterdir():
                try:
                    if not entry.name.isdigit() or (entry / "comm").read_text().strip() != "slirp4netns":
                        continue
                    fields = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines())
                except (OSError, ValueError):
                    continue
                if int(fields["PPid"]) == os.getpid():
                    uid = int(fields["Uid"].split()[1])
                    self.seen[int(entry.name)] = (uid, int(fields["CapEff"], 16))

    def stop(self) -> dict[int, tuple[int, int]]:
        self._stop.set()
        self._thread.join()
        return self.seen


def _contained_against_host_listener(
    provider: Any, config: SandboxConfig, marker: str, source: Callable[[int], str]
) -> tuple[ExecResult, list[Any]]:
    """Runs ``source(port)`` contained while a listener on the host's 127.0.0.1:port records what it
    accepted (``[None]``: nothing within 4 s); the result and that record."""
    server, thread, accepted = _host_listener()
    try:
        result = contained(provider, config, marker, source(server.getsockname()[1]))
        thread.join()
    finally:
        server.close()
    return result, accepted


def _host_listener() -> tuple[socket.socket, threading.Thread, list[Any]]:
    """A server on the host's 127.0.0.1 and the thread recording what it accepts (within 4 s)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[Any] = []
    server.settimeout(4)
    thread = threading.Thread(target=lambda: accepted.append(_accept_or_none(server)), daemon=True)
    thread.start()
    return server, thread, accepted


def _accept_or_none(server: socket.socket) -> Any:
    try:
        return server.accept()
    except OSError:
        return None


def test_dns_has_no_resolver_and_no_route(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(2)
    port = udp.getsockname()[1]
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
    source = (
        "import os, socket\n"
        "print('resolv', os.path.exists('/etc/resolv.conf'))\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.sendto({query!r}, ('127.0.0.1', {port}))\n"
        "print('sent')\n"
    )
    result = contained(local_provider, marked_config, marker, source)
    with pytest.raises(TimeoutError):
        udp.recvfrom(512)  # the query reached the sandbox's own loopback, never the host's
    udp.close()
    assert "resolv False" in result.stdout


def test_only_loopback_interface(local_provider: Any, marked_config: SandboxConfig, marker: str) -> None:
    source = "import os\nprint(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else open('/proc/net/dev').read())\n"
    result = contained(local_provider, marked_config, marker, source)
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
    assert interfaces == ["lo"] or result.stdout.strip() == "['lo']", result.stdout


# ---------------------------------------------------------------------------- host files
@pytest.mark.parametrize(
    "path",
    [str(PROJECT_FILE), "/root/.bashrc", "/etc/shadow", "/home", str(Path(sys.executable).resolve())],
    ids=["project", "home", "shadow", "home-dirs", "host-venv-python"],
)
def test_cannot_read_host_files(
    local_provider: Any, marked_config: SandboxConfig, marker: str, path: str
) -> None:
    source = f"try:\n    print('READ', len(open({path!r}, 'rb').read()))\nexcept OSError as e:\n    print('denied', type(e).__name__)\n"
    result = contained(local_provider, marked_config, marker, source)
    assert "READ" not in result.stdout and "denied" in result.stdout, result


def test_cannot_read_world_readable_host_tmp_file(
    local_provider: Any, marked_config: SandboxConfig, marker: str, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)
    source = f"import os\nprint('exists', os.path.exists({str(secret)!r}))\n"
    assert "exists False" in contained(local_provider, marked_config, marker, source).stdout


def test_host_environment_is_not_inherited(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    os.environ["TELESCOPE_HOST_SECRET"] = "s3cret"
    try:
        source = "import os\nprint(sorted(os.environ))\n"
        result = contained(local_provider, marked_config, marker, source)
    finally:
        del os.environ["TELESCOPE_HOST_SECRET"]
    assert "TELESCOPE_HOST_SECRET" not in result.stdout and "TELESCOPE_TEST_MARKER" in result.stdout


@pytest.mark.parametrize(
    "target", ["/usr/pwned", "/etc/pwned", "/pwned", "/dev/pwned", "/proc/sys/kernel/hostname"]
)
def test_cannot_write_outside_workspace(
    local_provider: Any, marked_config: SandboxConfig, marker: str, target: str
) -> None:
    source = f"try:\n    open({target!r}, 'w').write('x'); print('WROTE')\nexcept OSError as e:\n    print('denied', e)\n"
    result = contained(local_provider, marked_config, marker, source)
    assert "WROTE" not in result.stdout and "denied" in result.stdout
    if not target.startswith("/proc"):
        assert not os.path.exists(target)


def test_upload_refuses_symlink_planted_by_sandbox(
    local_provider: Any, marked_config: SandboxConfig, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")

    async def go() -> None:
        async with local_provider.sandbox(marked_config) as sb:
            await local_provider.execute(
                sb, f"ln -s {victim} link && mkdir d && ln -s {tmp_path} d/up", timeout=5
            )
            with pytest.raises(SandboxPathError):
                await local_provider.upload_bytes(sb, "link", b"pwned")
            with pytest.raises(SandboxPathError):
                await local_provider.upload_bytes(sb, "d/up/victim.txt", b"pwned")
            with pytest.raises(SandboxPathError):
                await local_provider.upload_bytes(sb, "../../etc/passwd", b"pwned")

    run(go())
    assert victim.read_text() == "original"


# ---------------------------------------------------------------------------- resources
def test_fork_bomb_is_contained(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(
        memory_mb=256, max_processes=32, environment_vars={"TELESCOPE_TEST_MARKER": marker}
    )
    source = (
        "import os, time\n"
        "failed = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "    except OSError:\n"
        "        failed += 1\n"
        "print('fork failures', failed)\n"
    )
    result = contained(local_provider, config, marker, source, timeout=3)
    assert "fork failures" in result.stdout
    assert int(result.stdout.split()[-1]) >= 200 - 32


def test_memory_bomb_hits_the_limit(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(memory_mb=128, environment_vars={"TELESCOPE_TEST_MARKER": marker})
    source = (
        "blocks = []\nfor _ in range(64):\n    blocks.append(bytearray(64 << 20))\nprint('ALLOCATED 4 GiB')\n"
    )
    result = contained(local_provider, config, marker, source, timeout=10)
    assert "ALLOCATED" not in result.stdout and "MemoryError" in result.stderr
    assert result.exit_code not in (0, None)


def test_cpu_spin_is_killed_at_timeout(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    source = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"
    result = contained(local_provider, marked_config, marker, source, timeout=1)
    assert result.timed_out and result.exit_code is None


def test_sleep_forever_is_killed_at_timeout(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    result = contained(local_provider, marked_config, marker, "import time\ntime.sleep(100000)\n", timeout=1)
    assert result.timed_out and result.exit_code is None and not result.ok


def test_disk_fill_is_stopped(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(disk_size_gb=0.02, environment_vars={"TELESCOPE_TEST_MARKER": marker})
    source = (
        "import os\nchunk = os.urandom(1 << 20)\n"
        "for i in range(4000):\n"
        "    with open(f'f{i}', 'wb') as fh:\n        fh.write(chunk)\n"
        "print('WROTE 4 GB')\n"
    )
    result = contained(local_provider, config, marker, source, timeout=8)
    assert "WROTE" not in result.stdout
    assert result.limit_exceeded == "disk" and result.exit_code is None


def test_single_huge_file_hits_file_size_limit(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(disk_size_gb=0.01, environment_vars={"TELESCOPE_TEST_MARKER": marker})
    source = "f = open('big', 'wb')\nfor _ in range(100):\n    f.write(b'x' * (1 << 20)); f.flush()\nprint('WROTE')\n"
    result = contained(local_provider, config, marker, source, timeout=5)
    assert "WROTE" not in result.stdout
    assert result.exit_code not in (0, None) or result.limit_exceeded == "disk"


def test_shared_memory_fill_is_capped(local_provider: Any, marked_config: SandboxConfig, marker: str) -> None:
    source = (
        "written = 0\nchunk = b'x' * (1 << 20)\n"
        "try:\n    with open('/dev/shm/fill', 'wb') as fh:\n"
        "        for _ in range(2048):\n            fh.write(chunk); fh.flush(); written += 1\n"
        "except OSError as e:\n    print('stopped', written, e.errno)\n"
    )
    result = contained(local_provider, marked_config, marker, source)
    assert "stopped" in result.stdout and int(result.stdout.split()[1]) <= 64


def test_huge_output_is_truncated(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(max_output_bytes=4096, environment_vars={"TELESCOPE_TEST_MARKER": marker})
    source = "import sys\nfor _ in range(200):\n    sys.stdout.write('o' * 100000); sys.stderr.write('e' * 100000)\n"
    result = contained(local_provider, config, marker, source, timeout=10)
    assert result.exit_code == 0
    assert result.stdout == "o" * 4096 and result.stderr == "e" * 4096
    assert result.stdout_truncated and result.stderr_truncated


def test_too_many_open_files(local_provider: Any, marked_config: SandboxConfig, marker: str) -> None:
    source = "fs = []\ntry:\n    for _ in range(100000):\n        fs.append(open('/dev/null'))\nexcept OSError as e:\n    print('stopped at', len(fs))\n"
    result = contained(local_provider, marked_config, marker, source)
    assert "stopped at" in result.stdout and int(result.stdout.split()[-1]) < 1024


# ---------------------------------------------------------------------------- processes
def test_killing_the_parent_does_not_touch_the_host(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    source = f"import os, signal\nprint(os.getppid(), flush=True)\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({os.getpid()}, signal.SIGKILL)\n"
    result = contained(local_provider, marked_config, marker, source)
    assert result.exit_code is not None  # the command ended by itself; this process is alive


def test_kill_all_reachable_processes(local_provider: Any, marked_config: SandboxConfig, marker: str) -> None:
    bystander = subprocess.Popen(
        ["sleep", "30"], user=65534, group=65534, extra_groups=[]
    )  # same uid, on the host
    try:
        contained(local_provider, marked_config, marker, "import os, signal\nos.kill(-1, signal.SIGKILL)\n")
        assert bystander.poll() is None, "the sandbox killed a host process of its uid"
    finally:
        bystander.kill()
        bystander.wait()


def test_escaped_daemon_dies_with_the_command(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    source = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.setpgid(0, 0)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent exits')\n"
    )
    result = contained(local_provider, marked_config, marker, source)
    assert "parent exits" in result.stdout and result.exit_code == 0


def test_background_process_does_not_outlive_execute(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    async def go() -> ExecResult:
        async with local_provider.sandbox(marked_config) as sb:
            result = await local_provider.execute(
                sb, "nohup setsid sleep 60 >/dev/null 2>&1 & echo started", timeout=5
            )
            assert processes_with_marker(marker) == []  # gone before destroy
            return result

    assert run(go()).stdout.strip() == "started"


def test_no_privilege_escalation(local_provider: Any, marked_config: SandboxConfig, marker: str) -> None:
    source = (
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print('uid', os.getuid(), 'caps', status['CapEff'].strip(), 'nnp', status['NoNewPrivs'].strip())\n"
        "for attempt in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.chroot('/')):\n"
        "    try:\n        attempt(); print('ESCALATED')\n"
        "    except OSError as e:\n        print('denied', e.errno)\n"
    )
    result = contained(local_provider, marked_config, marker, source)
    assert "uid 65534 caps 0000000000000000 nnp 1" in result.stdout
    assert "ESCALATED" not in result.stdout and result.stdout.count("denied") == 3


def test_ptrace_and_namespace_tricks_fail(
    local_provider: Any, marked_config: SandboxConfig, marker: str
) -> None:
    # The seccomp filter refuses unshare and mount (test_local_seccomp.py); beneath it, the
    # sandbox's processes hold no capabilities and cannot create user namespaces.
    source = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('pid1caps', open('/proc/1/status').read().split('CapEff:')[1].split()[0])\n"
        "print('pids', max(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print('mount', libc.mount(b'none', b'/workspace', b'tmpfs', 0, None), ctypes.get_errno())\n"
    )
    result = contained(local_provider, marked_config, marker, source)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["pid1caps"] == "0000000000000000"
    assert int(lines["pids"]) < 100  # a private pid namespace: no host process is visible
    assert lines["unshare"].startswith("-1 ") and lines["mount"].startswith("-1 ")


def test_sandboxes_cannot_see_each_other(local_provider: Any, marked_config: SandboxConfig) -> None:
    async def go() -> ExecResult:
        async with local_provider.sandbox(marked_config) as a, local_provider.sandbox(marked_config) as b:
            await local_provider.upload_bytes(a, "secret.txt", b"sandbox a")
            host_path = a.native.workspace.work + "/secret.txt"
            return await local_provider.execute(
                b, f"cat {host_path} /proc/*/root/workspace/secret.txt 2>&1; ls /workspace", timeout=5
            )

    result = run(go())
    assert "sandbox a" not in result.stdout
