"""vLLM servers of a run take orders only from the run (finding 2: vLLM was launched without
``--api-key`` and with ``VLLM_SERVER_DEV_MODE=1``, so ``/collective_rpc``, ``/sleep``, ``/pause`` ...
were open to anyone who reached the port).

vLLM cannot run on CPU CI: the guard (the ASGI middleware vLLM adds with ``--middleware``) is driven
here as vLLM's server drives it, with a recording engine client in ``app.state``; that vLLM adds it
outermost, without dev mode, and that the engine client has these methods is checked against vLLM's
source by test_vllm_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.cluster import run_secret
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.args import MANAGED_FLAGS, build_vllm_env, check_vllm_config
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.inference.vllm_engine.guard import RPC_PATH, TelescopeGuard

from .conftest import make_cfg

SECRET = "vllm-probe-" + "3" * 40
AUTH = {"authorization": f"Bearer {SECRET}"}
JSON = {"content-type": "application/json"}


class Engine:
    """The engine client methods the guard calls (vLLM's ``EngineClient``), recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.paused = False

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause", mode, clear_cache))
        self.paused = True

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))
        self.paused = False

    async def is_paused(self) -> bool:
        return self.paused

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:  # type: ignore[type-arg]
        self.calls.append(("rpc", method, args, kwargs))
        return [{"rank": 1}, 2]


def serve(
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
    kind: str = "http",
    serving_models: Any = None,
) -> tuple[int, dict[str, Any], Engine, list[str]]:
    """One request through ``TelescopeGuard`` in front of a stand-in for vLLM's routes
    (``serving_models``: what ``app.state.openai_serving_models`` holds)."""
    engine = Engine()
    reached: list[str] = []

    async def vllm(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"vllm": true}'})

    guard = TelescopeGuard(vllm, secret=SECRET, bound_host="127.0.0.1")
    path, _, query = path.partition("?")
    scope = {
        "type": kind,
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1:8000", **headers}.items()],
        "app": SimpleNamespace(
            state=SimpleNamespace(engine_client=engine, openai_serving_models=serving_models)
        ),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    if kind == "websocket":
        return (
            (sent[0]["code"], {}, engine, reached)
            if sent[0]["type"] == "websocket.close"
            else (0, {}, engine, reached)
        )
    status = sent[0]["status"]
    return status, json.loads(sent[1]["body"] or b"{}"), engine, reached


#: vLLM's routes a run never needs, and ours: none may be reached without the secret.
PATHS = [
    ("POST", "/pause?mode=abort"),
    ("POST", "/resume"),
    ("GET", "/is_paused"),
    ("POST", RPC_PATH),
    ("POST", "/collective_rpc"),
    ("POST", "/sleep"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/invocations"),
    ("POST", "/v1/load_lora_adapter"),
    ("GET", "/server_info"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
]


@pytest.mark.parametrize(("method", "path"), PATHS, ids=[p for _, p in PATHS])
@pytest.mark.parametrize("authorization", [None, "Bearer nope", SECRET])
def test_no_route_but_health_without_the_run_secret(
    method: str, path: str, authorization: str | None
) -> None:
    headers = {**JSON, **({"authorization": authorization} if authorization else {})}
    status, body, engine, reached = serve(method, path, headers, b"{}")
    assert status == 401 and "TELESCOPE_RUN_SECRET" in body["error"]
    assert engine.calls == [] and reached == []


def test_health_is_open_and_the_secret_lets_the_rest_through_to_vllm() -> None:
    assert serve("GET", "/health", {})[3] == ["/health"]
    status, body, _, reached = serve("POST", "/v1/completions", {**AUTH, **JSON}, b"{}")
    assert (status, body, reached) == (200, {"vllm": True}, ["/v1/completions"])


def test_websockets_need_the_secret_too() -> None:
    assert serve("GET", "/v1/realtime", {}, kind="websocket")[0] == 1008
    assert serve("GET", "/v1/realtime", AUTH, kind="websocket")[3] == ["/v1/realtime"]


def test_foreign_host_and_non_json_posts_are_refused() -> None:
    status, body, engine, reached = serve(
        "POST", "/pause", {**AUTH, **JSON, "host": "evil.example:8000"}, b"{}"
    )
    assert status == 421 and "evil.example" in body["error"] and not engine.calls and not reached
    status, body, engine, reached = serve("POST", "/pause", {**AUTH, "content-type": "text/plain"}, b"{}")
    assert status == 415 and "application/json" in body["error"] and not engine.calls


def test_the_guard_serves_pause_resume_and_is_paused_through_the_engine_client() -> None:
    """These exist in vLLM only in dev mode, which the run leaves off."""
    status, body, engine, reached = serve(
        "POST", "/pause?mode=keep&clear_cache=false", {**AUTH, **JSON}, b"{}"
    )
    assert (status, body, engine.calls, reached) == (
        200,
        {"status": "paused"},
        [("pause", "keep", False)],
        [],
    )
    assert serve("POST", "/pause", {**AUTH, **JSON})[2].calls == [("pause", "abort", True)]  # vLLM's defaults
    status, body, _, _ = serve("POST", "/pause?mode=nap", {**AUTH, **JSON})
    assert status == 400 and "keep" in body["error"]
    assert serve("POST", "/resume", {**AUTH, **JSON})[2].calls == [("resume",)]
    assert serve("GET", "/is_paused", AUTH)[:2] == (200, {"is_paused": False})


def test_the_rpc_route_calls_only_the_worker_extensions_methods() -> None:
    call = {"method": "telescope_update_weights", "args": ["3"], "kwargs": {"apply": "true"}, "timeout": None}
    status, body, engine, reached = serve("POST", RPC_PATH, {**AUTH, **JSON}, json.dumps(call).encode())
    assert status == 200 and body == {"results": [{"rank": 1}, "2"]} and reached == []
    assert engine.calls == [("rpc", "telescope_update_weights", ("3",), {"apply": "true"})]
    for method in ("load_model", "__init__", "execute_model", None):
        status, body, engine, _ = serve(
            "POST", RPC_PATH, {**AUTH, **JSON}, json.dumps({"method": method}).encode()
        )
        assert status == 400 and "telescope_" in body["error"] and engine.calls == []
    bad = {"method": "telescope_update_weights", "args": [3]}
    assert serve("POST", RPC_PATH, {**AUTH, **JSON}, json.dumps(bad).encode())[0] == 400


def test_vllm_is_launched_without_dev_mode_with_the_guard_and_its_key_only_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import telescope.core.inference.vllm_engine.engine as engine_mod
    from telescope.core.inference.launcher import ServerCommand, ServerProcess

    monkeypatch.setattr(engine_mod, "vllm_executable", lambda: "/venv/bin/vllm")
    monkeypatch.setenv(run_secret.ENV_VAR, SECRET)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # the user's own: the run turns it off
    cfg = make_cfg(enable_vllm_tracing=True)
    engine = VllmEngine(cfg, VllmEngineKwargs())
    monkeypatch.setattr(engine, "otlp_endpoint", lambda: "http://127.0.0.1:4318/v1/traces")
    command = engine.server_command(0, "127.0.0.1", 8100, "/run/resolved.json")
    assert build_vllm_env(cfg)["VLLM_SERVER_DEV_MODE"] == "0"
    assert command.argv[command.argv.index("--middleware") + 1].endswith("guard.TelescopeGuard")
    assert SECRET not in repr(command) and "--api-key" not in command.argv
    # what the launched process sees: the key vLLM reads, the OTLP header, dev mode off
    out = tmp_path / "env.json"
    keys = [
        "VLLM_API_KEY",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "VLLM_SERVER_DEV_MODE",
        "TELESCOPE_SERVER_HOST",
    ]
    code = f"import json, os; json.dump({{k: os.environ.get(k) for k in {keys!r}}}, open({str(out)!r}, 'w'))"
    probe = ServerCommand([sys.executable, "-c", code], command.env, "http://127.0.0.1:9", command.secret_env)
    server = ServerProcess(probe, tmp_path / "log")
    server.process.wait(30)
    server.stop()
    seen = json.loads(out.read_text())
    assert seen == {
        "VLLM_API_KEY": SECRET,
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"Authorization=Bearer%20{SECRET}",
        "VLLM_SERVER_DEV_MODE": "0",
        "TELESCOPE_SERVER_HOST": "127.0.0.1",
    }


def test_extra_args_cannot_replace_the_api_key() -> None:
    assert "--api-key" in MANAGED_FLAGS
    with pytest.raises(ValueError, match="--api-key"):
        check_vllm_config(make_cfg(), VllmEngineKwargs(extra_args=["--api-key", "mine"]))


def test_the_guard_imports_nothing_heavy() -> None:
    """It runs inside vLLM's API server process: importing it must not pull torch or vLLM."""
    code = (
        "import sys; import telescope.core.inference.vllm_engine.guard; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'ray') if m in sys.modules))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )
