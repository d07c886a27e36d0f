"""Provider failures are sorted where they happen: the infrastructure's (counted, marked with a cause,
raised as they are: callers keep branching on the class) or the user's; what the command did stays a
result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from telescope.core import infra
from telescope.core.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxConfigError,
    SandboxError,
    SandboxHandle,
    SandboxNotRunningError,
    SandboxOOMError,
    SandboxPool,
    SandboxProvider,
)


class ScriptedProvider(SandboxProvider):
    """An in-memory provider (a fake: no sandbox runs) raising ``fail[action]`` when set."""

    name = "scripted"

    def __init__(self) -> None:
        self.fail: dict[str, BaseException] = {}

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        if "create" in self.fail:
            raise self.fail["create"]
        return SandboxHandle("s1", self.name, config)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: Any
    ) -> ExecResult:
        if "execute" in self.fail:
            raise self.fail["execute"]
        return ExecResult(exit_code=None, stdout="", stderr="", limit_exceeded="memory")

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        if "upload" in self.fail:
            raise self.fail["upload"]

    async def _destroy(self, handle: SandboxHandle) -> None:
        return None


def counted() -> dict[tuple[str, str], int]:
    return {(o.cause, o.provider): n for o, n in infra.ORIGINS.drain().items()}


@pytest.mark.parametrize(
    ("action", "raised", "cause"),
    [
        ("create", SandboxError("503 service unavailable"), "sandbox_create"),
        ("create", OSError("no space left"), "sandbox_create"),
        ("execute", SandboxOOMError("killed by the provider for memory"), "sandbox_oom"),
        ("execute", SandboxNotRunningError("sandbox terminated"), "sandbox_lost"),
        ("execute", TimeoutError(), "provider_timeout"),
        ("upload", SandboxError("500 internal error"), "provider_error"),
    ],
)
def test_infrastructure_failures_carry_a_cause_and_are_counted_once(
    action: str, raised: BaseException, cause: str
) -> None:
    provider = ScriptedProvider()

    async def go() -> None:
        if action == "create":
            provider.fail[action] = raised
            await provider.create()
        async with provider.sandbox() as handle:
            provider.fail[action] = raised
            if action == "execute":
                await provider.execute(handle, "true")
            await provider.upload_bytes(handle, "f", b"x")

    counted()
    with pytest.raises(type(raised)) as info:
        asyncio.run(go())
    assert info.value is raised  # as it was: a caller catching SandboxNotRunningError still does
    marked = infra.infra_cause(info.value)
    assert marked is not None and (marked.cause, marked.provider) == (cause, "scripted")
    assert counted() == {(cause, "scripted"): 1}


def test_user_errors_and_what_the_code_did_are_not_the_infrastructures() -> None:
    provider = ScriptedProvider()
    counted()
    provider.fail["create"] = SandboxConfigError("cpu=9 exceeds this machine's 2 cores")
    with pytest.raises(SandboxConfigError) as info:
        asyncio.run(provider.create())
    assert infra.infra_cause(info.value) is None
    provider.fail.clear()

    async def oom_of_the_code() -> ExecResult:
        async with provider.sandbox() as handle:
            return await provider.execute(handle, "python3 hog.py")

    result = asyncio.run(oom_of_the_code())  # the code hit its memory limit: a result, the model's
    assert result.limit_exceeded == "memory"
    assert counted() == {}


def test_a_pool_whose_creates_keep_failing_raises_the_infrastructure_error_counted_per_create() -> None:
    class Unavailable(ScriptedProvider):
        async def _create(self, config: SandboxConfig) -> SandboxHandle:
            raise SandboxError("quota exceeded (503)")  # a new error each time, as an SDK raises

    provider = Unavailable()
    counted()

    async def go() -> None:
        async with SandboxPool(provider, size=1, max_consecutive_create_failures=2) as pool:
            await pool.acquire(timeout=5)

    with pytest.raises(SandboxError, match="2 sandbox creations failed in a row") as info:
        asyncio.run(go())
    marked = infra.infra_cause(info.value)  # the last create's failure, which the pool's error is raised from
    assert marked is not None and marked.cause == "sandbox_create"
    assert counted()[("sandbox_create", "scripted")] >= 2  # each failed create, not the pool's summary


def test_the_fault_seam_fails_creates_and_commands_as_a_provider_would_and_each_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from telescope.core import faults
    from telescope.core.sandbox import build_provider
    from telescope.core.sandbox.faults import FaultySandboxProvider

    class Registry:  # what build_provider needs of the plugin registry
        def create(self, kind: str, name: str, kwargs: Any) -> SandboxProvider:
            return ScriptedProvider()

    assert isinstance(build_provider(Registry(), "scripted"), ScriptedProvider)  # unset: as it is
    monkeypatch.setenv("TELESCOPE_FAULTS", "sandbox_create_fail=0.3,sandbox_exec_kill=0.2")
    provider = build_provider(Registry(), "scripted")
    assert isinstance(provider, FaultySandboxProvider) and provider.name == "scripted"
    faults.injected.clear()
    counted()
    outcomes: list[str] = []

    async def go() -> None:
        for _ in range(60):
            try:
                async with provider.sandbox() as handle:
                    result = await provider.execute(handle, "true")
                    outcomes.append(f"result {result.limit_exceeded}")
            except (SandboxError, SandboxNotRunningError) as exc:
                marked = infra.infra_cause(exc)
                assert marked is not None
                outcomes.append(marked.cause)

    asyncio.run(go())
    injected = faults.injected
    assert injected["sandbox_create_fail"] > 0 and injected["sandbox_exec_kill"] > 0
    assert outcomes.count("sandbox_create") == injected["sandbox_create_fail"]
    assert outcomes.count("sandbox_lost") == injected["sandbox_exec_kill"]
    assert counted() == {
        ("sandbox_create", "scripted"): injected["sandbox_create_fail"],
        ("sandbox_lost", "scripted"): injected["sandbox_exec_kill"],
    }
