"""The local provider's cgroup v2 limits: what it writes (against a directory mimicking cgroupfs),
that a command joins its sandbox's cgroup before it runs, the fallback line where cgroup v2 is not
delegated, and, where it is, real enforcement (skipped elsewhere, with the reason)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import SandboxConfig
from telescope.sandboxes.local import _cgroup
from telescope.sandboxes.local._cgroup import (
    CgroupLimits,
    CgroupParent,
    SandboxCgroup,
    find_parent,
    join_argv,
    own_cgroup,
)

from .conftest import run

#: What the kernel puts in a new cgroup (the part of it the provider reads or writes).
INTERFACE = {
    "cgroup.controllers": "cpu memory pids\n",
    "cgroup.subtree_control": "",
    "cgroup.procs": "",
    "cgroup.kill": "",
    "memory.max": "max\n",
    "memory.swap.max": "max\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    "pids.max": "max\n",
    "cpu.max": "max 100000\n",
}


def fake_mkdir(path: str) -> None:
    os.mkdir(path)
    for name, text in INTERFACE.items():
        Path(path, name).write_text(text)


@pytest.fixture
def cgroupfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A fake cgroup v2 root and this process's cgroup file: it lives in /user.slice/app.scope."""
    monkeypatch.setattr(_cgroup, "_mkdir", fake_mkdir)
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "user.slice").mkdir()
    fake_mkdir(str(root / "user.slice" / "app.scope"))
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/user.slice/app.scope\n")
    return root, self_cgroup


def test_own_cgroup_is_read_from_the_unified_line(tmp_path: Path) -> None:
    path = tmp_path / "cgroup"
    path.write_text("12:pids:/a\n1:name=systemd:/b\n0::/user.slice/x.scope\n")
    assert own_cgroup(str(path)) == "/user.slice/x.scope"
    path.write_text("4:memory:/docker/abc\n")  # cgroup v1 only
    assert own_cgroup(str(path)) is None


def test_no_cgroup_v2_is_a_reason_not_an_error(tmp_path: Path) -> None:
    found = find_parent(str(tmp_path))
    assert found == f"{tmp_path} is not a cgroup v2 hierarchy (cgroup v1 or hybrid)"


def test_missing_controllers_are_named(cgroupfs: tuple[Path, Path]) -> None:
    root, self_cgroup = cgroupfs
    (root / "user.slice" / "app.scope" / "cgroup.controllers").write_text("cpu\n")
    found = find_parent(str(root), str(self_cgroup))
    assert found == (
        f"the controllers memory, pids are not available in {root}/user.slice/app.scope (cgroup.controllers)"
    )


def test_the_parent_is_a_child_of_the_own_cgroup_with_the_controllers_enabled(
    cgroupfs: tuple[Path, Path],
) -> None:
    root, self_cgroup = cgroupfs
    found = find_parent(str(root), str(self_cgroup))
    scope = root / "user.slice" / "app.scope"
    assert found == CgroupParent(str(scope / "telescope-sandboxes"))
    # enabled in the process's own cgroup (for its new child) and in that child (for the sandboxes)
    assert (scope / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (scope / "telescope-sandboxes" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_a_configured_parent_is_used_as_it_is(cgroupfs: tuple[Path, Path]) -> None:
    root, self_cgroup = cgroupfs
    fake_mkdir(str(root / "delegated"))
    assert find_parent(str(root), str(self_cgroup), parent="/delegated") == CgroupParent(
        str(root / "delegated")
    )
    assert (root / "delegated" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert find_parent(str(root), str(self_cgroup), parent="nope") == (
        f"cgroup_parent 'nope' does not exist under {root}"
    )


def test_a_sandbox_cgroup_holds_its_limits_and_is_removed(cgroupfs: tuple[Path, Path]) -> None:
    root, self_cgroup = cgroupfs
    parent = find_parent(str(root), str(self_cgroup))
    assert isinstance(parent, CgroupParent)
    cgroup = parent.create("local-abc", CgroupLimits(memory_bytes=256 << 20, pids=36, cpus=1.5))
    path = Path(cgroup.path)
    assert path == Path(parent.path) / "local-abc"
    written = {
        name: (path / name).read_text() for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
    }
    assert written == {
        "memory.max": "268435456",  # 256 x 2**20
        "memory.swap.max": "0",
        "pids.max": "36",
        "cpu.max": "150000 100000",  # 1.5 cores: 150 ms of each 100 ms period
    }
    assert cgroup.oom_kills() == 0
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert cgroup.oom_kills() == 2
    cgroup.remove()
    assert not path.exists() and (path / "..").resolve().is_dir()


def test_without_swap_accounting_only_the_swap_limit_is_skipped(cgroupfs: tuple[Path, Path]) -> None:
    root, self_cgroup = cgroupfs
    del INTERFACE["memory.swap.max"]
    try:
        parent = find_parent(str(root), str(self_cgroup))
        assert isinstance(parent, CgroupParent)
        cgroup = parent.create("local-x", CgroupLimits(memory_bytes=1 << 20, pids=5, cpus=0.001))
    finally:
        INTERFACE["memory.swap.max"] = "max\n"
    path = Path(cgroup.path)
    assert not (path / "memory.swap.max").exists()
    assert (path / "cpu.max").read_text() == "1000 100000"  # never below the kernel's 1 ms


def test_a_command_joins_the_cgroup_before_it_runs(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    argv = join_argv(SandboxCgroup(str(tmp_path)), ["/bin/sh", "-c", "echo $$"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert procs.read_text().strip() == out.strip()  # the very process that then ran the command
    failed = subprocess.run(
        join_argv(SandboxCgroup(str(tmp_path / "gone")), ["true"]), capture_output=True, text=True
    )
    assert failed.returncode == 125 and "cannot join the cgroup" in failed.stderr


# ---------------------------------------------------------------------------- the provider
def test_the_provider_says_which_limits_hold_and_uses_the_cgroup(
    cgroupfs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from telescope.sandboxes.local import provider as local

    root, self_cgroup = cgroupfs
    monkeypatch.setattr(_cgroup, "own_cgroup", lambda path="": own_cgroup(str(self_cgroup)))
    if local.shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    caplog.set_level(logging.INFO)
    provider = local.LocalSandboxProvider(local.LocalSandboxKwargs(cgroup_root=str(root)))
    parent = root / "user.slice" / "app.scope" / "telescope-sandboxes"
    lines = [r.getMessage() for r in caplog.records if "local sandbox limits" in r.getMessage()]
    assert lines == [
        f"local sandbox limits: a cgroup v2 per sandbox under {parent} (memory.max with swap off, pids.max, "
        "cpu.max) and the rlimits (memory_mb: RLIMIT_AS per process; max_processes: RLIMIT_NPROC in the "
        "sandbox's user namespace; cpu time: RLIMIT_CPU; no CPU share)"
    ]
    kills = iter([0, 1])  # the kernel's oom_kill count before and after the command
    monkeypatch.setattr(SandboxCgroup, "oom_kills", lambda self: next(kills))

    async def go() -> tuple[Any, Path, str, str]:
        handle = await provider.create(SandboxConfig(memory_mb=64, max_processes=10, cpu=0.5))
        path = Path(handle.native.cgroup.path)
        try:
            limits = (path / "memory.max").read_text() + " " + (path / "pids.max").read_text()
            result = await provider.execute(handle, "kill -9 $$", timeout=10)
            procs = (path / "cgroup.procs").read_text()
        finally:
            await provider.destroy(handle)
        return result, path, limits, procs

    result, path, limits, procs = run(go())
    assert limits == f"{64 << 20} {10 + 4}"
    assert procs.strip().isdigit()  # the command's launcher joined before bubblewrap started
    assert result.limit_exceeded == "memory" and result.exit_code is None
    assert not path.exists()  # removed with the sandbox


def test_where_cgroup_v2_is_not_delegated_rlimits_hold_and_one_line_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from telescope.sandboxes.local import provider as local

    if local.shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    caplog.set_level(logging.INFO)
    provider = local.LocalSandboxProvider(local.LocalSandboxKwargs(cgroup_root=str(tmp_path)))
    lines = [r.getMessage() for r in caplog.records if "local sandbox limits" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("local sandbox limits: rlimits (memory_mb: RLIMIT_AS")
    assert lines[0].endswith(
        f"no cgroup v2 limits: {tmp_path} is not a cgroup v2 hierarchy (cgroup v1 or hybrid)"
    )

    async def go() -> Any:
        handle = await provider.create(SandboxConfig())
        try:
            return handle.native.cgroup, await provider.execute(handle, "echo ok", timeout=10)
        finally:
            await provider.destroy(handle)

    cgroup, result = run(go())
    assert cgroup is None and result.stdout == "ok\n"


# ---------------------------------------------------------------------------- real enforcement
def delegated() -> CgroupParent:
    found = find_parent()
    if isinstance(found, str):
        pytest.skip(f"no delegated cgroup v2 here: {found}")
    return found


def test_memory_of_all_processes_together_is_held_by_the_cgroup(local_provider: Any) -> None:
    delegated()
    # four processes of 48 MiB each: every one within RLIMIT_AS (128 MiB), together over memory.max
    source = (
        "import os, time\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        b = bytearray(48 << 20)\n"
        "        for i in range(0, len(b), 4096): b[i] = 1\n"
        "        time.sleep(5); os._exit(0)\n"
        "codes = [os.wait()[1] for _ in range(4)]\n"
        "print('KILLED' if any(codes) else 'ALL ALIVE')\n"
        "raise SystemExit(1 if any(codes) else 0)\n"
    )

    async def go() -> Any:
        handle = await local_provider.create(SandboxConfig(memory_mb=128))
        try:
            await local_provider.upload_bytes(handle, "prog.py", source.encode())
            return await local_provider.execute(handle, "python3 prog.py", timeout=30)
        finally:
            await local_provider.destroy(handle)

    result = run(go())
    assert "ALL ALIVE" not in result.stdout and result.limit_exceeded == "memory", result


def test_processes_are_held_by_pids_max(local_provider: Any) -> None:
    parent = delegated()
    config = SandboxConfig(max_processes=8)

    async def go() -> Any:
        handle = await local_provider.create(config)
        try:
            path = Path(handle.native.cgroup.path)
            assert path.parent == Path(parent.path) and (path / "pids.max").read_text().strip() == "12"
            return await local_provider.execute(
                handle, "for i in $(seq 40); do sleep 5 & done; wait", timeout=20
            )
        finally:
            await local_provider.destroy(handle)

    result = run(go())
    assert "fork" in result.stderr.lower() or "resource" in result.stderr.lower(), result
