"""The sandbox pool (warm sandboxes, limits, lifetime checks) and cleanup at exit and on signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from telescope.core.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxError,
    SandboxHandle,
    SandboxPool,
    SandboxPoolClosedError,
    SandboxPoolTimeoutError,
    SandboxProvider,
)

from .conftest import run


class CountingProvider(SandboxProvider):
    """An in-memory provider that records every call (and can be told to fail creates)."""

    name = "counting"

    def __init__(self, fail_creates: int = 0) -> None:
        self.created: list[str] = []
        self.destroyed: list[str] = []
        self.fail_creates = fail_creates

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        await asyncio.sleep(0.01)
        if self.fail_creates:
            self.fail_creates -= 1
            raise RuntimeError("quota exceeded")
        handle = SandboxHandle(f"c{len(self.created)}", self.name, config)
        self.created.append(handle.id)
        return handle

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        return ExecResult(0, handle.id, "")

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        return None

    async def _destroy(self, handle: SandboxHandle) -> None:
        self.destroyed.append(handle.id)


def test_pool_keeps_sandboxes_warm_and_reuses_them() -> None:
    provider = CountingProvider()

    async def go() -> None:
        async with SandboxPool(provider, size=2) as pool:
            await asyncio.sleep(0.1)
            assert pool.counts == {"idle": 2, "in_use": 0, "creating": 0}
            first = await pool.acquire(timeout=1)
            await pool.release(first)
            again = await pool.acquire(timeout=1)
            await pool.release(again)
            assert {first.id, again.id} <= {"c0", "c1"}
            assert len(provider.created) == 2
        assert sorted(provider.destroyed) == ["c0", "c1"]

    run(go())


def test_pool_enforces_the_concurrency_limit() -> None:
    provider = CountingProvider()
    peak = 0
    active = 0

    async def worker(pool: SandboxPool) -> None:
        nonlocal peak, active
        async with pool.sandbox(timeout=5):
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1

    async def go() -> None:
        async with SandboxPool(provider, size=1, max_sandboxes=3) as pool:
            await asyncio.gather(*(worker(pool) for _ in range(12)))
            first = await pool.acquire()
            held = [first, await pool.acquire(), await pool.acquire()]
            with pytest.raises(SandboxPoolTimeoutError):
                await pool.acquire(timeout=0.1)
            for h in held:
                await pool.release(h)

    run(go())
    assert peak == 3 and len(provider.created) == 3


def test_pool_retires_sandboxes_near_end_of_lifetime() -> None:
    provider = CountingProvider()
    config = SandboxConfig(timeout_seconds=100)

    async def go() -> None:
        async with SandboxPool(provider, config, size=1) as pool:
            handle = await pool.acquire(timeout=1)
            handle.created_at -= 85  # 15% of the lifetime left: below the 20% release threshold
            await pool.release(handle)
            assert handle.id in provider.destroyed
            fresh = await pool.acquire(timeout=1)
            assert fresh.id != handle.id
            fresh.created_at -= 95  # 5% left: refused at acquire as well
            pool._idle.append(fresh)  # put it back behind the pool's back
            pool._in_use.discard(id(fresh))
            pool._in_use_handles.pop(id(fresh), None)
            newest = await pool.acquire(timeout=1)
            assert newest.id not in (handle.id, fresh.id) and fresh.id in provider.destroyed
            await pool.release(newest)

    run(go())
    assert provider.created == ["c0", "c1", "c2"]


def test_pool_reports_repeated_create_failures() -> None:
    provider = CountingProvider(fail_creates=10)

    async def go() -> None:
        async with SandboxPool(provider, size=1, max_consecutive_create_failures=3) as pool:
            with pytest.raises(SandboxError, match="quota exceeded"):
                await pool.acquire(timeout=10)
            assert pool.stats["create_failures"] >= 3

    run(go())


def test_pool_discards_sandbox_after_sandbox_error_and_refuses_after_close() -> None:
    provider = CountingProvider()

    async def go() -> SandboxPool:
        pool = await SandboxPool(provider, size=1).start()
        with pytest.raises(SandboxError):
            async with pool.sandbox(timeout=1) as sb:
                raise SandboxError("broken", sandbox_id=sb.id)
        assert provider.destroyed == ["c0"]
        await pool.close()
        with pytest.raises(SandboxPoolClosedError):
            await pool.acquire(timeout=1)
        return pool

    run(go())
    with pytest.raises(ValueError, match="size"):
        SandboxPool(provider, size=5, max_sandboxes=2)


def test_pool_with_local_provider_runs_commands(local_provider: Any) -> None:
    async def go() -> list[str]:
        async with SandboxPool(local_provider, SandboxConfig(), size=2, max_sandboxes=2) as pool:

            async def job(i: int) -> str:
                async with pool.sandbox(timeout=10) as sb:
                    return (await local_provider.execute(sb, f"echo {i}", timeout=5)).stdout.strip()

            return await asyncio.gather(*(job(i) for i in range(6)))

    assert run(go()) == [str(i) for i in range(6)]


_CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from telescope.sandboxes.local import LocalSandboxProvider
    from telescope.core.sandbox import SandboxConfig

    async def main():
        provider = LocalSandboxProvider()
        config = SandboxConfig(environment_vars={"TELESCOPE_TEST_MARKER": sys.argv[1]})
        handles = [await provider.create(config) for _ in range(2)]
        for h in handles:
            asyncio.create_task(provider.execute(h, "sleep 60", timeout=120))
        await asyncio.sleep(0.5)
        print(" ".join(h.native.workspace.root for h in handles), flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_destroys_live_sandboxes(local_provider: Any, marker: str, sig: int, tmp_path: Path) -> None:
    from .conftest import processes_with_marker

    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), marker], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        roots = child.stdout.readline().split()
        assert len(roots) == 2 and all(os.path.isdir(r) for r in roots)
        assert processes_with_marker(marker, settle_s=0)
        child.send_signal(sig)
        child.wait(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    deadline = time.monotonic() + 5
    while any(os.path.exists(r) for r in roots) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(r) for r in roots)
    assert processes_with_marker(marker) == []
