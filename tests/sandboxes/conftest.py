"""Fixtures for sandbox tests: a local provider (needs bubblewrap), an async runner and a
scanner that finds processes left behind by a sandbox (by an environment-variable marker)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from telescope.core.sandbox import SandboxConfig, cleanup_all, live_sandboxes

MARKER_VAR = "TELESCOPE_TEST_MARKER"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion on a fresh event loop."""
    return asyncio.run(coro)


def processes_with_marker(marker: str, settle_s: float = 1.0) -> list[int]:
    """PIDs (host view) whose environment or command line contains ``marker``.

    Processes already SIGKILLed by a namespace teardown can linger for a moment while the
    kernel reaps them, so the scan repeats for up to ``settle_s`` until it comes back empty.
    """
    deadline = time.monotonic() + settle_s
    while (found := _scan(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _scan(marker: str) -> list[int]:
    found = []
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as fh:
                    if needle in fh.read():
                        found.append(int(name))
                        break
            except OSError:
                continue
    return found


@pytest.fixture
def runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    return run


@pytest.fixture
def marker() -> str:
    return f"hostile-{uuid.uuid4().hex}"


@pytest.fixture
def local_provider() -> Any:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    from telescope.sandboxes.local import LocalSandboxProvider

    return LocalSandboxProvider()


@pytest.fixture
def marked_config(marker: str) -> SandboxConfig:
    """A small sandbox whose processes carry ``marker`` in their environment."""
    return SandboxConfig(
        memory_mb=512, disk_size_gb=0.05, max_processes=64, environment_vars={MARKER_VAR: marker}
    )


@pytest.fixture(autouse=True)
def _no_leaked_sandboxes() -> Any:
    before = {id(h) for h in live_sandboxes()}
    yield
    leaked = [h for h in live_sandboxes() if id(h) not in before]
    cleanup_all()
    assert not leaked, f"test leaked sandboxes: {[h.id for h in leaked]}"
