"""The local provider run by a user who is not root: the process limit still holds.

RLIMIT_NPROC counts the processes of a (user namespace, uid) pair since Linux 5.14, so set
inside bubblewrap's new user namespace it counts the sandbox's processes only. Set before
bubblewrap (what the provider did as root only), it counted every process of the user on the
host: a user with more processes than the limit could not even start a sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from telescope.sandboxes.local._launch import nproc_counted_per_user_namespace

NOBODY = 65534
HOST_PROCESSES = 40
MAX_PROCESSES = 16

#: Run as the unprivileged user: HOST_PROCESSES of its processes on the host, then a fork
#: bomb in a sandbox with max_processes=MAX_PROCESSES.
SCRIPT = """
import asyncio, json, os, subprocess, sys
from telescope.core.sandbox import SandboxConfig
from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

host = [subprocess.Popen(['sleep', '60']) for _ in range({host})]
BOMB = '''
import os, time
forked = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        forked += 1
    except OSError:
        pass
print(forked)
'''

async def go():
    provider = LocalSandboxProvider(LocalSandboxKwargs(workspace_root=sys.argv[1]))
    async with provider.sandbox(SandboxConfig(memory_mb=256, max_processes={limit})) as sb:
        await provider.upload_bytes(sb, 'bomb.py', BOMB.encode())
        result = await provider.execute(sb, 'python3 bomb.py', timeout=5)
        status = await provider.execute(sb, 'grep -E "^(Uid|Seccomp):" /proc/self/status', timeout=5)
    return provider, result, status

try:
    provider, result, status = asyncio.run(go())
finally:
    for proc in host:
        proc.kill(); proc.wait()
print(json.dumps({{'euid': os.geteuid(), 'as_root': provider._as_root, 'stdout': result.stdout,
                  'stderr': result.stderr, 'exit_code': result.exit_code, 'status': status.stdout.split()}}))
"""


def _unprivileged_prefix(home: Path) -> list[str]:
    """How to run a command as a user who is not root, or skip saying why it cannot."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing to become uid 65534")
        prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        os.chown(home, NOBODY, NOBODY)
    probe = subprocess.run(
        [*prefix, "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(
            "bubblewrap does not run unprivileged here (user namespaces are disabled for users: "
            f"kernel.unprivileged_userns_clone or an AppArmor restriction): {probe.stderr.strip()}"
        )
    return prefix


@pytest.fixture
def home() -> Iterator[Path]:
    """A HOME/TMPDIR the unprivileged user can write (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="telescope-unprivileged-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_fork_bomb_is_capped_without_root_and_the_users_other_processes_do_not_count(home: Path) -> None:
    """Also checks that the seccomp filter is installed when bubblewrap runs unprivileged."""
    if not nproc_counted_per_user_namespace():
        pytest.skip(
            f"kernel {os.uname().release} counts RLIMIT_NPROC per user, not per user namespace (5.14+)"
        )
    done = _run_unprivileged(home, SCRIPT.format(host=HOST_PROCESSES, limit=MAX_PROCESSES))
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["euid"] != 0 and report["as_root"] is False
    assert report["exit_code"] == 0, report
    assert report["status"][-2:] == ["Seccomp:", "2"], report  # the deny list is installed too
    forked = int(report["stdout"])
    # Capped: the sandbox's own processes (python, bubblewrap's init) count too. The 40 host
    # processes of the same user do not: they alone exceed the limit.
    assert MAX_PROCESSES - 4 <= forked <= MAX_PROCESSES, report


@pytest.mark.parametrize(
    ("release", "per_namespace"),
    [
        ("5.13.19-generic", False),
        ("4.19.0", False),
        ("5.14.0-284.el9", True),
        ("6.18.44-fc-v669", True),
        ("x", False),
    ],
)
def test_nproc_is_counted_per_user_namespace_since_linux_5_14(release: str, per_namespace: bool) -> None:
    assert nproc_counted_per_user_namespace(release) is per_namespace


OLD_KERNEL = """
import asyncio, json, logging, os, sys
from telescope.core.sandbox import SandboxConfig
from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider, provider

logging.basicConfig(level=logging.WARNING)
provider.nproc_counted_per_user_namespace = lambda: False

async def go():
    local = LocalSandboxProvider(LocalSandboxKwargs(workspace_root=sys.argv[1]))
    async with local.sandbox(SandboxConfig(max_processes=20)) as sb:
        command = "grep -E '^Max processes' /proc/self/limits; grep Seccomp: /proc/self/status"
        return await local.execute(sb, command, timeout=5)

result = asyncio.run(go())
print(json.dumps({'euid': os.geteuid(), 'stdout': result.stdout.split(), 'stderr': result.stderr}))
"""


def test_before_linux_5_14_without_root_there_is_no_process_limit_but_the_filter_holds(home: Path) -> None:
    """Where RLIMIT_NPROC counts per user across the machine, the limit is left out (it would
    count the user's own processes) and a warning says so; the seccomp filter is unaffected."""
    done = _run_unprivileged(home, OLD_KERNEL)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["euid"] != 0, report
    assert "no process limit (max_processes): kernel" in done.stderr
    limits = report["stdout"]
    assert limits[:2] == ["Max", "processes"] and limits[2] != "22", report  # not 20 + 2
    assert limits[-2:] == ["Seccomp:", "2"], report


def _run_unprivileged(home: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a user who is not root, with ``home`` as HOME, TMPDIR and workspaces."""
    prefix = _unprivileged_prefix(home)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home)}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code, str(home / "sandboxes")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done
