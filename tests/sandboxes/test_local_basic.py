"""Round trips, argument checks, concurrency and the unsandboxed mode of the ``local`` provider."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import (
    SandboxConfig,
    SandboxConfigError,
    SandboxError,
    SandboxNotRunningError,
    SandboxPathError,
    SandboxUnavailableError,
)
from telescope.sandboxes.local import LocalSandboxKwargs, LocalSandboxProvider

from .conftest import processes_with_marker, run


def test_upload_execute_round_trip(local_provider: Any, tmp_path: Path) -> None:
    payload = os.urandom(300_000)
    local_file = tmp_path / "data.bin"
    local_file.write_bytes(payload)

    async def go() -> tuple[str, str, str]:
        async with local_provider.sandbox(SandboxConfig(environment_vars={"GREETING": "hi there"})) as sb:
            await local_provider.upload_file(sb, "in/data.bin", local_file)
            await local_provider.upload_bytes(
                sb, "/workspace/prog.py", b"import os\nprint(os.environ['GREETING'])\n"
            )
            digest = await local_provider.execute(sb, "sha256sum in/data.bin", timeout=10)
            greet = await local_provider.execute(sb, "python3 ../prog.py", timeout=10, working_dir="in")
            fails = await local_provider.execute(sb, "echo oops >&2; exit 3", timeout=10)
            assert fails.exit_code == 3 and fails.stderr == "oops\n" and not fails.ok
            return digest.stdout.split()[0], greet.stdout, greet.stderr

    digest, greeting, err = run(go())
    assert digest == hashlib.sha256(payload).hexdigest()
    assert greeting == "hi there\n" and err == ""


def test_files_persist_across_executions_and_vanish_after_destroy(local_provider: Any) -> None:
    async def go() -> str:
        handle = await local_provider.create(SandboxConfig())
        await local_provider.execute(handle, "echo 41 > n && mkdir -p /tmp/x && echo t > /tmp/x/f", timeout=5)
        result = await local_provider.execute(handle, "echo $(( $(cat n) + 1 )); cat /tmp/x/f", timeout=5)
        root = handle.native.workspace.root
        await local_provider.destroy(handle)
        await local_provider.destroy(handle)  # idempotent
        assert not os.path.exists(root)
        with pytest.raises(SandboxNotRunningError):
            await local_provider.execute(handle, "true", timeout=5)
        return result.stdout

    assert run(go()) == "42\nt\n"


def test_bad_arguments_are_clear_errors(local_provider: Any) -> None:
    async def go() -> None:
        async with local_provider.sandbox() as sb:
            with pytest.raises(ValueError, match="timeout"):
                await local_provider.execute(sb, "true", timeout=0)
            with pytest.raises(ValueError, match="command"):
                await local_provider.execute(sb, "  ", timeout=1)
            with pytest.raises(SandboxPathError, match="outside"):
                await local_provider.execute(sb, "true", timeout=1, working_dir="/etc")
            with pytest.raises(SandboxPathError):
                await local_provider.upload_bytes(sb, "/usr/bin/evil", b"x")

    run(go())
    with pytest.raises(SandboxConfigError, match="image"):
        run(local_provider.create(SandboxConfig(image="python:3.11")))
    with pytest.raises(SandboxConfigError, match="gpu_count"):
        run(local_provider.create(SandboxConfig(gpu_count=1)))
    with pytest.raises(SandboxConfigError, match="cores"):
        run(local_provider.create(SandboxConfig(cpu=(os.cpu_count() or 1) + 1)))
    with pytest.raises(ValueError, match="environment variable"):
        SandboxConfig(environment_vars={"A=B": "x"})


def test_handle_of_another_provider_is_refused(local_provider: Any) -> None:
    async def go() -> None:
        async with local_provider.sandbox() as sb:
            sb.provider = "e2b"
            try:
                with pytest.raises(SandboxError, match="belongs to provider 'e2b'"):
                    await local_provider.execute(sb, "true", timeout=1)
            finally:
                sb.provider = "local"

    run(go())


def test_concurrent_executions_are_isolated(local_provider: Any) -> None:
    async def one(i: int) -> str:
        async with local_provider.sandbox() as sb:
            await local_provider.upload_bytes(sb, "i.txt", str(i).encode())
            result = await local_provider.execute(
                sb, "sleep 0.2; cat i.txt; ls /workspace | wc -l", timeout=10
            )
            return result.stdout

    async def go() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert run(go()) == [f"{i}1\n" for i in range(8)]


def test_bulk_destroy_kills_running_commands(local_provider: Any, marker: str) -> None:
    config = SandboxConfig(environment_vars={"TELESCOPE_TEST_MARKER": marker})

    async def go() -> list[Any]:
        handles = [await local_provider.create(config) for _ in range(3)]
        running = [asyncio.create_task(local_provider.execute(h, "sleep 30", timeout=60)) for h in handles]
        await asyncio.sleep(0.5)
        assert len(processes_with_marker(marker, settle_s=0)) >= 3
        await local_provider.bulk_destroy(handles)
        return await asyncio.gather(*running)

    results = run(go())
    assert all(r.exit_code != 0 for r in results)
    assert processes_with_marker(marker) == []


def test_bad_bwrap_path_is_refused(tmp_path: Path) -> None:
    not_executable = tmp_path / "bwrap"
    not_executable.write_text("")
    with pytest.raises(SandboxUnavailableError, match="not executable"):
        LocalSandboxProvider(LocalSandboxKwargs(bwrap_path=str(not_executable)))


def test_unsandboxed_mode_still_applies_rlimits_and_uid(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        LocalSandboxProvider()
    with caplog.at_level("WARNING"):
        provider = LocalSandboxProvider(LocalSandboxKwargs(allow_unsandboxed=True))
    assert "missing protection" in caplog.text
    with pytest.raises(SandboxConfigError, match="network_access"):
        run(provider.create(SandboxConfig(network_access=False)))

    async def go() -> tuple[Any, Any, Any]:
        async with provider.sandbox(SandboxConfig(memory_mb=128)) as sb:
            ident = await provider.execute(sb, "id -u; pwd", timeout=5)
            mem = await provider.execute(sb, "python3 -c 'bytearray(1 << 30)'", timeout=10)
            spin = await provider.execute(sb, "sleep 20", timeout=1)
            return ident, mem, spin

    ident, mem, spin = run(go())
    expected_uid = "65534" if os.geteuid() == 0 else str(os.getuid())
    assert ident.stdout.split()[0] == expected_uid
    assert "MemoryError" in mem.stderr and spin.timed_out


def test_unsandboxed_mode_kills_escaped_processes(monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    provider = LocalSandboxProvider(LocalSandboxKwargs(allow_unsandboxed=True))
    config = SandboxConfig(environment_vars={"TELESCOPE_TEST_MARKER": marker})

    async def go() -> Any:
        async with provider.sandbox(config) as sb:
            return await provider.execute(
                sb, "setsid sleep 60 >/dev/null 2>&1 < /dev/null & echo started", timeout=5
            )

    assert run(go()).stdout == "started\n"
    assert processes_with_marker(marker) == []


def test_workspace_root_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by another uid")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)
    provider = LocalSandboxProvider(LocalSandboxKwargs(workspace_root=str(foreign)))
    with pytest.raises(SandboxUnavailableError, match="owned by uid 0"):
        run(provider.create(SandboxConfig()))


def test_network_access_without_slirp4netns_is_refused_never_the_hosts_network(
    local_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.sandboxes.local import provider as local_module

    monkeypatch.setattr(local_module, "slirp4netns_path", lambda: None)
    with pytest.raises(SandboxConfigError, match="needs slirp4netns: install slirp4netns"):
        local_provider.check_config(SandboxConfig(network_access=True))
