"""What a server process leaves in logs/inference/server_N.log, and what a failed start reports.

Real server processes of the transformers engine (the built-in tiny model): one that cannot
start (max_model_len beyond the model's positions) and one that serves a few requests with
the default ``inference_access_log: false``.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from telescope.core.cluster.run_secret import auth_headers
from telescope.core.errors import describe_failure, failure_log_tail
from telescope.core.inference.launcher import ServerCommand, ServerProcess, ServerStartError, cause_line
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.inference.transformers_engine.engine import TransformersEngine
from telescope.core.inference.transformers_engine.requestlog import RequestSummary
from telescope.core.weights.group import free_port

from .conftest import make_cfg

STAND_IN_SERVER = """
import sys
print("\\rLoading 0%\\rLoading 100%", flush=True)
try:
    raise ValueError("max_model_len: 8192 exceeds the 4096 positions of model 'm'")
finally:
    print("server 0: cleaning up", file=sys.stderr)
"""


def test_the_start_error_carries_the_cause_line_first_then_the_log_tail(tmp_path: Path) -> None:
    """The real launcher around a stand-in server process (a Python script that fails as a server would)."""
    command = ServerCommand([sys.executable, "-c", STAND_IN_SERVER], {}, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ServerStartError) as info:
        ServerProcess(command, tmp_path / "server_0.log").wait_ready(timeout_s=30, interval_s=0.05)
    first, *rest = str(info.value).splitlines()
    cause = "ValueError: max_model_len: 8192 exceeds the 4096 positions of model 'm'"
    assert first == f"inference server {command.url} exited with code 1 before it was ready: {cause}"
    assert rest[0] == f"last log lines ({tmp_path / 'server_0.log'}):"
    # one line per line: the progress bar in its last state; the cause is the last exception line
    assert set(rest[1:]) == {
        "Loading 100%",
        "server 0: cleaning up",
        "Traceback (most recent call last):",
        '  File "<string>", line 5, in <module>',
        cause,
    }
    assert rest[-1] == cause and info.value.log_tail == tuple(rest[1:])


@pytest.mark.slow
def test_a_server_that_cannot_start_reports_the_cause_from_its_log(tmp_path: Path, tiny_path: str) -> None:
    engine = TransformersEngine(
        make_cfg(model=tiny_path, max_model_len=8192), TransformersEngineKwargs(num_threads=1)
    )
    with pytest.raises(ServerStartError) as info:
        engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(tmp_path))
    err = info.value
    cause = "ValueError: max_model_len: 8192 exceeds the 4096 positions of model"
    log_lines = (tmp_path / "server_0.log").read_text().splitlines()
    assert log_lines[-1].startswith(cause)  # the process wrote it before it exited
    first, *rest = str(err).splitlines()
    assert first.endswith("before it was ready: " + log_lines[-1]) and "exited with code 1" in first
    assert rest[0] == f"last log lines ({tmp_path / 'server_0.log'}):" and rest[-1] == log_lines[-1]
    assert "Traceback (most recent call last):" in rest
    # a failed run prints describe_failure (the first line) and the tail; both survive Ray's pickling
    copy = pickle.loads(pickle.dumps(err))
    outer = RuntimeError("servers did not start")
    outer.__cause__ = copy
    assert describe_failure(outer) == f"ServerStartError: {first}"
    assert failure_log_tail(outer)[-1] == log_lines[-1] and len(failure_log_tail(outer, lines=3)) == 3


def test_cause_line_is_the_last_exception_line() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "torch.OutOfMemoryError: CUDA out",
        "[rank0] shutting down",
    ]
    assert cause_line(lines) == "torch.OutOfMemoryError: CUDA out"
    assert cause_line(["loading", "Killed"]) == "Killed" and cause_line([]) == ""
    vllm = [
        "(EngineCore_DP0 pid=7) ValueError: no GPU",
        "(APIServer pid=6) resource_tracker: leaked semaphore",
    ]
    assert cause_line(vllm) == "ValueError: no GPU"


def test_access_log_is_off_by_default_and_summarised(tmp_path: Path, tiny_path: str) -> None:
    cfg = make_cfg(model=tiny_path)
    assert cfg.inference_access_log is False
    server = TransformersEngine(cfg, TransformersEngineKwargs(num_threads=1)).launch(
        0, host="127.0.0.1", port=free_port(), log_dir=str(tmp_path)
    )
    try:
        for path in ("/health", "/health", "/v1/models"):
            request = urllib.request.Request(server.url + path, headers=auth_headers())
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
    finally:
        server.stop()  # SIGTERM: aiohttp shuts down and the last summary is written
    log = (tmp_path / "server_0.log").read_text()
    assert "aiohttp.access" not in log and '"GET /health' not in log
    summary = [ln for ln in log.splitlines() if "requests in the last" in ln]
    assert len(summary) == 1, log
    # wait_ready's own /health polls come first: at least one, plus our two
    health = int(summary[0].split("GET /health ")[1].split(",")[0].split(")")[0])
    assert health >= 3 and "GET /v1/models 1" in summary[0] and summary[0].endswith("errors 0")


def test_request_summary_counts_routes_and_errors() -> None:
    now = [0.0]
    summary = RequestSummary(interval_s=60, clock=lambda: now[0])

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("handler failed")

    app = web.Application(middlewares=[summary.middleware])
    app.router.add_get("/ok", ok)
    app.router.add_get("/boom", boom)
    app.router.add_get("/item/{id}", ok)

    async def requests() -> None:
        async with TestClient(TestServer(app)) as client:
            for path in ("/ok", "/ok", "/boom", "/item/1", "/item/2", "/missing"):
                await client.get(path)

    asyncio.run(requests())
    now[0] = 30.0
    assert summary.take_line() == (
        "requests in the last 30 s: 6 (GET /ok 2, GET /item/{id} 2, GET /boom 1, GET /missing 1); errors 1"
    )
    assert summary.take_line() is None  # nothing since: nothing to log


def test_a_request_the_client_gave_up_on_is_not_a_server_error() -> None:
    from types import SimpleNamespace

    summary = RequestSummary(interval_s=60, clock=lambda: 0.0)
    request = SimpleNamespace(
        method="POST",
        path="/v1/completions",
        match_info=SimpleNamespace(route=SimpleNamespace(resource=None)),
    )

    async def cancelled(request: object) -> web.Response:
        raise asyncio.CancelledError  # aiohttp cancels the handler when a rollout is cancelled

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(summary.middleware(request, cancelled))  # type: ignore[arg-type]
    assert summary.take_line() == "requests in the last 0 s: 1 (POST /v1/completions 1); errors 0"
