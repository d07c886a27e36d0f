"""Cloud providers against their real SDKs, with the network calls replaced.

Each SDK is the installed official package. Calls that would leave the machine are replaced
by mocks whose every call is checked against the real SDK signature (``inspect.bind``), and
the request/parameter objects are the SDK's own pydantic models, so a renamed field fails
here. Prime's control plane is exercised through its own httpx client with only the
transport replaced. Tests against the real services run when credentials are set.
"""

from __future__ import annotations

import inspect
import os
import sys
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from telescope.core.sandbox import (
    SandboxAuthError,
    SandboxConfig,
    SandboxConfigError,
    SandboxDependencyError,
    SandboxImagePullError,
    SandboxNotRunningError,
)

from .conftest import run


def binds(real: Any, call: Any, *, method: bool = False) -> dict[str, Any]:
    """Check a recorded mock call against the real SDK callable; return the bound arguments."""
    args, kwargs = call
    params = inspect.signature(real).bind(*((None,) if method else ()), *args, **kwargs)
    return dict(params.arguments)


# ------------------------------------------------------------------------------- e2b
def _e2b_provider(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("e2b")
    from telescope.sandboxes.e2b import E2BSandboxKwargs, E2BSandboxProvider

    monkeypatch.setenv("E2B_API_KEY", "e2b_test")
    return E2BSandboxProvider(E2BSandboxKwargs(template="my-template"))


def _e2b_sandbox() -> Any:
    from e2b.sandbox_async.commands.command import Commands
    from e2b.sandbox_async.filesystem.filesystem import Filesystem

    return SimpleNamespace(
        sandbox_id="sbx-1",
        commands=mock.create_autospec(Commands, instance=True),
        files=mock.create_autospec(Filesystem, instance=True),
        kill=mock.AsyncMock(return_value=True),
    )


def test_e2b_create_execute_upload_destroy(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = _e2b_provider(monkeypatch)
    import e2b

    sandbox = _e2b_sandbox()
    config = SandboxConfig(
        timeout_seconds=900, environment_vars={"A": "1"}, labels={"run": "r1"}, network_access=False
    )
    real_create = e2b.AsyncSandbox.create
    create = mock.AsyncMock(return_value=sandbox)
    monkeypatch.setattr(e2b.AsyncSandbox, "create", create)
    sandbox.commands.run.return_value = SimpleNamespace(exit_code=0, stdout="x" * 5000, stderr="")

    async def go() -> Any:
        handle = await provider.create(config)
        result = await provider.execute(handle, "echo hi", timeout=7, working_dir="/code")
        await provider.upload_bytes(handle, "/code/a.py", b"print(1)")
        await provider.destroy(handle)
        return handle, result

    handle, result = run(go())
    bound = binds(real_create, create.call_args)
    opts = bound.get("opts", {})
    assert bound["template"] == "my-template" and bound["timeout"] == 900
    assert bound["envs"] == {"A": "1"} and bound["metadata"] == {"run": "r1"}
    assert bound["allow_internet_access"] is False and opts["api_key"] == "e2b_test"
    assert handle.id == "sbx-1"
    assert sandbox.commands.run.call_args.kwargs == {"cwd": "/code", "timeout": 7.0}
    assert result.exit_code == 0 and result.stdout == "x" * 5000 and not result.stdout_truncated
    sandbox.files.write.assert_awaited_once_with("/code/a.py", b"print(1)")
    sandbox.kill.assert_awaited_once()


def test_e2b_exit_codes_timeouts_truncation_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = _e2b_provider(monkeypatch)
    import e2b

    sandbox = _e2b_sandbox()
    monkeypatch.setattr(e2b.AsyncSandbox, "create", mock.AsyncMock(return_value=sandbox))
    from e2b import CommandExitException, SandboxNotFoundException, TimeoutException

    async def go() -> list[Any]:
        handle = await provider.create(SandboxConfig(max_output_bytes=1024))
        sandbox.commands.run.side_effect = CommandExitException(
            stderr="boom", stdout="o" * 3000, exit_code=2, error=None
        )
        failed = await provider.execute(handle, "false", timeout=1)
        sandbox.commands.run.side_effect = TimeoutException("deadline exceeded")
        slow = await provider.execute(handle, "sleep 9", timeout=1)
        sandbox.commands.run.side_effect = SandboxNotFoundException("sandbox sbx-1 not found")
        with pytest.raises(SandboxNotRunningError, match="sbx-1"):
            await provider.execute(handle, "true", timeout=1)
        await provider.destroy(handle)
        return [failed, slow]

    failed, slow = run(go())
    assert failed.exit_code == 2 and failed.stderr == "boom"
    assert failed.stdout == "o" * 1024 and failed.stdout_truncated
    assert slow.timed_out and slow.exit_code is None


def test_e2b_rejects_resources_it_cannot_set_and_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = _e2b_provider(monkeypatch)
    for bad in (
        {"cpu": 2.0},
        {"memory_mb": 4096},
        {"disk_size_gb": 10.0},
        {"gpu_count": 1},
        {"max_processes": 10},
    ):
        with pytest.raises(SandboxConfigError, match=next(iter(bad))):
            provider.check_config(SandboxConfig(**bad))
    provider.check_config(SandboxConfig())  # defaults mean "the template's resources"
    monkeypatch.delenv("E2B_API_KEY")
    from telescope.sandboxes.e2b import E2BSandboxProvider

    with pytest.raises(SandboxAuthError, match="E2B_API_KEY"):
        E2BSandboxProvider()


def test_missing_sdk_names_the_pip_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope.sandboxes.prime import PrimeSandboxProvider

    monkeypatch.setenv("PRIME_API_KEY", "pk_test")
    monkeypatch.setitem(sys.modules, "prime_sandboxes", None)  # makes `import prime_sandboxes` fail
    with pytest.raises(SandboxDependencyError, match=r"prime-sandboxes.*telescope-sandboxes\[prime\]"):
        PrimeSandboxProvider()


# ------------------------------------------------------------------------------- daytona
@pytest.mark.daytona  # Daytona's SDK lives in .venv-daytona: `make test-daytona`
def test_daytona_maps_resources_and_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    daytona = pytest.importorskip("daytona")
    from telescope.sandboxes.daytona import DaytonaSandboxProvider

    monkeypatch.setenv("DAYTONA_API_KEY", "dt_test")
    provider = DaytonaSandboxProvider()
    sandbox = SimpleNamespace(id="dt-1", process=mock.Mock(), fs=mock.Mock())
    from daytona._async.filesystem import AsyncFileSystem
    from daytona._async.process import AsyncProcess
    from daytona.common.process import ExecuteResponse

    sandbox.process.exec = mock.AsyncMock(return_value=ExecuteResponse(exit_code=1, result="out"))
    sandbox.fs.upload_file = mock.AsyncMock()
    client = mock.Mock(create=mock.AsyncMock(return_value=sandbox), delete=mock.AsyncMock())
    provider._client = client
    config = SandboxConfig(
        cpu=2, memory_mb=4096, disk_size_gb=5, timeout_seconds=90, network_access=False, image="img:1"
    )

    async def go() -> Any:
        handle = await provider.create(config)
        result = await provider.execute(handle, "ls", timeout=2.5, working_dir="/w")
        await provider.upload_bytes(handle, "/w/f", b"data")
        await provider.destroy(handle)
        return result

    result = run(go())
    bound = binds(daytona.AsyncDaytona.create, client.create.call_args, method=True)
    params = bound["params"]
    assert isinstance(params, daytona.CreateSandboxFromImageParams)
    assert (params.resources.cpu, params.resources.memory, params.resources.disk) == (2, 4, 5)
    assert params.image == "img:1" and params.ttl_minutes == 2 and params.network_block_all is True
    exec_bound = binds(AsyncProcess.exec, sandbox.process.exec.call_args, method=True)
    assert exec_bound == {"self": None, "command": "ls", "cwd": "/w", "timeout": 3}
    binds(AsyncFileSystem.upload_file, sandbox.fs.upload_file.call_args, method=True)
    binds(daytona.AsyncDaytona.delete, client.delete.call_args, method=True)
    assert result.exit_code == 1 and result.stdout == "out" and result.stderr == ""
    with pytest.raises(SandboxConfigError, match="whole GiB"):
        provider.check_config(SandboxConfig(memory_mb=1500))
    with pytest.raises(SandboxConfigError, match="whole CPUs"):
        provider.check_config(SandboxConfig(cpu=0.5))


# ------------------------------------------------------------------------------- modal
def test_modal_maps_settings_onto_sandbox_create(monkeypatch: pytest.MonkeyPatch) -> None:
    modal = pytest.importorskip("modal")
    from telescope.sandboxes.modal import ModalSandboxKwargs, ModalSandboxProvider

    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    provider = ModalSandboxProvider(ModalSandboxKwargs(gpu_type="A10G"))
    proc = SimpleNamespace(
        wait=SimpleNamespace(aio=mock.AsyncMock(return_value=0)),
        stdout=SimpleNamespace(read=SimpleNamespace(aio=mock.AsyncMock(return_value="hello\n"))),
        stderr=SimpleNamespace(read=SimpleNamespace(aio=mock.AsyncMock(return_value=""))),
    )
    sandbox = SimpleNamespace(
        object_id="sb-1",
        exec=SimpleNamespace(aio=mock.AsyncMock(return_value=proc)),
        terminate=SimpleNamespace(aio=mock.AsyncMock()),
    )
    real_create, real_exec = modal.Sandbox.create, modal.Sandbox.exec
    create = mock.AsyncMock(return_value=sandbox)
    monkeypatch.setattr(modal.App, "lookup", SimpleNamespace(aio=mock.AsyncMock(return_value="app")))
    monkeypatch.setattr(modal.Sandbox, "create", SimpleNamespace(aio=create))
    config = SandboxConfig(cpu=2, memory_mb=3000, gpu_count=1, timeout_seconds=600, network_access=False)

    async def go() -> Any:
        handle = await provider.create(config)
        result = await provider.execute(handle, "echo hello", timeout=3)
        await provider.destroy(handle)
        return result

    result = run(go())
    bound = binds(real_create, create.call_args)
    assert bound["cpu"] == 2 and bound["memory"] == 3000 and bound["gpu"] == "A10G:1"
    assert bound["timeout"] == 600 and bound["block_network"] is True and bound["app"] == "app"
    exec_bound = binds(real_exec, sandbox.exec.aio.call_args, method=True)
    assert exec_bound["args"] == ("sh", "-c", "echo hello") and exec_bound["timeout"] == 3
    assert result.stdout == "hello\n" and result.exit_code == 0
    sandbox.terminate.aio.assert_awaited_once()
    with pytest.raises(SandboxConfigError, match="disk_size_gb"):
        provider.check_config(SandboxConfig(disk_size_gb=20))


# ------------------------------------------------------------------------------- prime
def _prime_provider(monkeypatch: pytest.MonkeyPatch) -> Any:
    from telescope.sandboxes.prime import PrimeSandboxProvider

    monkeypatch.setenv("PRIME_API_KEY", "pk_test")
    return PrimeSandboxProvider()


def test_prime_builds_the_sdk_request_and_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    ps = pytest.importorskip("prime_sandboxes")
    provider = _prime_provider(monkeypatch)
    config = SandboxConfig(cpu=2, memory_mb=2048, disk_size_gb=4, timeout_seconds=1800, labels={"k": "v"})

    async def go() -> Any:
        client = provider.client()
        with (
            mock.patch.object(
                client, "create", autospec=True, return_value=SimpleNamespace(id="p-1")
            ) as create,
            mock.patch.object(client, "wait_for_creation", autospec=True) as wait,
            mock.patch.object(
                client,
                "execute_command",
                autospec=True,
                return_value=ps.CommandResponse(stdout="ok", stderr="warn", exit_code=0),
            ) as execute,
            mock.patch.object(client, "delete", autospec=True, return_value={}) as delete,
        ):
            handle = await provider.create(config)
            result = await provider.execute(handle, "echo ok", timeout=4)
            await provider.destroy(handle)
        await provider.close()
        return create, wait, execute, delete, result

    create, wait, execute, delete, result = run(go())
    request = create.call_args.args[0]
    assert isinstance(request, ps.CreateSandboxRequest)
    assert (request.cpu_cores, request.memory_gb, request.disk_size_gb, request.timeout_minutes) == (
        2,
        2,
        4,
        30,
    )
    assert request.labels == ["k=v"]
    wait.assert_awaited_once_with("p-1")
    assert execute.call_args.args == ("p-1", "echo ok") and execute.call_args.kwargs["timeout"] == 4
    delete.assert_awaited_once_with("p-1")
    assert (result.stdout, result.stderr, result.exit_code) == ("ok", "warn", 0)
    with pytest.raises(SandboxConfigError, match="network"):
        provider.check_config(SandboxConfig(network_access=False))
    with pytest.raises(SandboxConfigError, match="whole minutes"):
        provider.check_config(SandboxConfig(timeout_seconds=90))


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, {"detail": "bad key"}, SandboxAuthError),
        (404, {"detail": "image not found"}, SandboxImagePullError),
    ],
)
def test_prime_http_errors_through_the_sdk_client(
    monkeypatch: pytest.MonkeyPatch, status: int, body: dict[str, Any], expected: type
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("prime_sandboxes")
    provider = _prime_provider(monkeypatch)
    seen: list[Any] = []

    def handler(request: Any) -> Any:
        seen.append((request.method, request.url.path, request.headers.get("authorization")))
        return httpx.Response(status, json=body)

    async def go() -> None:
        client = provider.client()
        sdk_http = client.client.client  # the SDK's own httpx client: keep its headers, swap the transport
        client.client.client = httpx.AsyncClient(
            headers=sdk_http.headers, timeout=sdk_http.timeout, transport=httpx.MockTransport(handler)
        )
        await sdk_http.aclose()
        with pytest.raises(expected):
            await provider.create(SandboxConfig())
        await provider.close()

    run(go())
    assert seen[0] == ("POST", "/api/v1/sandbox", "Bearer pk_test")


# ------------------------------------------------------------------------------- real services
@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY") or os.environ.get("E2B_API_KEY") == "e2b_test",
    reason="E2B_API_KEY not set",
)
def test_e2b_real_service() -> None:
    from telescope.sandboxes.e2b import E2BSandboxProvider

    provider = E2BSandboxProvider()

    async def go() -> Any:
        async with provider.sandbox(SandboxConfig(timeout_seconds=120)) as sb:
            await provider.upload_bytes(sb, "/tmp/a.txt", b"42")
            return await provider.execute(sb, "cat /tmp/a.txt", timeout=30)

    assert run(go()).stdout == "42"
