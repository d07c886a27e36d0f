"""The transformers engine takes orders only from its run (finding 2 of the closed-by-default issue:
pause/resume/abort and weight sync needed no credential, bodies were parsed as JSON whatever their
content type, and any Host was answered, so a web page paused the server with a ``no-cors`` fetch).

A real server on 127.0.0.1, probed with raw HTTP the way an outsider would.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from telescope.core.cluster import run_secret
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.weights.group import free_port

from .conftest import make_cfg

SECRET = "probe-secret-" + "7" * 40


@pytest.fixture(scope="module")
def server(tiny_path: str) -> Iterator[SimpleNamespace]:
    from telescope.core.inference.transformers_engine.server import start_in_thread

    old = os.environ.get(run_secret.ENV_VAR)
    os.environ[run_secret.ENV_VAR] = SECRET
    port = free_port()
    srv = start_in_thread(make_cfg(), TransformersEngineKwargs(max_num_seqs=4), port=port)
    yield SimpleNamespace(port=port, engine=srv.state.engine)
    srv.stop()
    if old is None:
        os.environ.pop(run_secret.ENV_VAR, None)
    else:
        os.environ[run_secret.ENV_VAR] = old


def call(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """Status and body of one raw request (``headers`` replace the defaults: Host names the server)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        if body is not None:
            sent["Content-Length"] = str(len(body))
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


AUTH = {"Authorization": f"Bearer {SECRET}"}
JSON = {"Content-Type": "application/json"}
COMPLETION = json.dumps({"prompt": [5, 17, 42], "max_tokens": 2, "temperature": 0}).encode()

#: Every route but /health, with a body the route accepts.
ROUTES = [
    ("POST", "/pause?mode=keep", b"{}"),
    ("POST", "/resume", b"{}"),
    ("POST", "/abort_requests", b"{}"),
    ("POST", "/v1/completions", COMPLETION),
    (
        "POST",
        "/telescope/weights/init",
        json.dumps({"host": "127.0.0.1", "port": 1, "world_size": 2, "rank": 1}).encode(),
    ),
    ("POST", "/telescope/weights/update", b'{"version": 999}'),
    ("GET", "/is_paused", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/models", None),
    ("GET", "/telescope/weights/version", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {SECRET}", SECRET])
def test_every_route_but_health_needs_the_run_secret(
    server: SimpleNamespace, method: str, path: str, body: bytes | None, authorization: str | None
) -> None:
    headers = {**JSON, **({"Authorization": authorization} if authorization else {})}
    status, text = call(server.port, method, path, body, headers)
    assert status == 401, text
    assert "TELESCOPE_RUN_SECRET" in text and SECRET not in text
    assert not server.engine.is_paused and server.engine.weight_version == 0


def test_health_is_open_and_the_secret_opens_the_rest(server: SimpleNamespace) -> None:
    assert call(server.port, "GET", "/health") == (200, "ok")
    status, text = call(server.port, "POST", "/v1/completions", COMPLETION, {**AUTH, **JSON})
    assert status == 200 and len(json.loads(text)["choices"][0]["token_ids"]) == 2
    assert call(server.port, "POST", "/pause?mode=keep", b"{}", {**AUTH, **JSON})[0] == 200
    assert server.engine.is_paused
    assert call(server.port, "POST", "/resume", b"", {**AUTH, **JSON})[0] == 200
    assert not server.engine.is_paused


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_post_that_is_not_json_is_refused_unread(server: SimpleNamespace, content_type: str | None) -> None:
    """A ``no-cors`` fetch from a web page can only send these content types (or none)."""
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    status, text = call(server.port, "POST", "/pause?mode=keep", b"{}", headers)
    assert status == 415, text
    assert "application/json" in text
    assert not server.engine.is_paused


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", ""])
def test_a_foreign_host_is_refused(server: SimpleNamespace, host: str) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends its own Host."""
    status, text = call(server.port, "POST", "/pause?mode=keep", b"{}", {**AUTH, **JSON, "Host": host})
    assert status == 421, text
    assert "Host" in text
    assert not server.engine.is_paused
    assert call(server.port, "GET", "/health", None, {"Host": host})[0] == 421


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST:1234", "[::1]:80", "10.1.2.3:8100"])
def test_loopback_names_and_addresses_are_this_server(server: SimpleNamespace, host: str) -> None:
    """An address literal cannot be rebound; only names other than localhost are refused."""
    assert call(server.port, "GET", "/is_paused", None, {**AUTH, "Host": host}) == (
        200,
        '{"is_paused": false}',
    )


def test_weights_init_joins_only_a_group_the_driver_named(server: SimpleNamespace) -> None:
    """The run's secret admits the driver; the group's random name keeps everyone who merely reaches
    the store's port out of its rendezvous, so a server never joins a group without one."""
    body = {"host": "127.0.0.1", "port": 1, "world_size": 2, "rank": 1, "timeout_s": 1.0}
    for name in (None, "telescope-weights", "telescope-weights-123"):
        sent = dict(body, **({"group_name": name} if name else {}))
        status, text = call(
            server.port, "POST", "/telescope/weights/init", json.dumps(sent).encode(), {**AUTH, **JSON}
        )
        assert status == 400, text
        assert "group_name" in text and "nonce" in text


def test_a_server_process_without_the_run_secret_refuses_to_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It would otherwise serve open: it stops before loading the model, naming the variable."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != run_secret.ENV_VAR}
    config = tmp_path / "run.json"
    config.write_text("{}")
    argv = [sys.executable, "-m", "telescope.core.inference.transformers_engine.server"]
    argv += ["--config", str(config), "--host", "127.0.0.1", "--port", str(free_port())]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "MissingRunSecretError: TELESCOPE_RUN_SECRET is not set" in done.stderr
