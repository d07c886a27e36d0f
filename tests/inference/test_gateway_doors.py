"""The agent gateway checks Host and content type like every other listener of a run
(``cluster.http_guard``): before, it answered any Host (a DNS-rebinding page of evil.example reached
it) and parsed every POST body as JSON whatever its content type.

A real gateway on 127.0.0.1, probed with raw HTTP. Its engine is a stand-in that records calls: a
refused request must never reach it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.inference.gateway.app import Gateway, GatewaySettings
from telescope.core.inference.gateway.serve import GatewayThread

from .test_server_doors import call

SECRET = "gateway-secret-" + "5" * 40
AUTH = {"Authorization": f"Bearer {SECRET}"}
JSON = {"Content-Type": "application/json"}
CHAT = json.dumps({"model": "other", "messages": [{"role": "user", "content": "hi"}]}).encode()


class RecordingEngine:
    """Stand-in for the engine client (a ``ServerClient``): records that it was called, and fails."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise AssertionError(f"the engine was called ({name}) for a request the gateway must refuse")

        return called

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def gateway() -> Iterator[SimpleNamespace]:
    engine = RecordingEngine()
    settings = GatewaySettings(served_model_name="tiny", max_model_len=64)
    thread = GatewayThread(lambda: Gateway(engine, None, settings, secret=SECRET))
    port = int(thread.url.rsplit(":", 1)[1].split("/")[0])
    yield SimpleNamespace(port=port, engine=engine, capture=thread.gateway.capture, thread=thread)
    thread.stop()


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", ""])
def test_a_foreign_host_is_refused_on_every_route(gateway: SimpleNamespace, host: str) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends its own Host."""
    key = gateway.thread.call(lambda: gateway.capture.open(f"r-{host}")).key
    for method, path, body, headers in [
        ("GET", "/health", None, {}),
        ("GET", "/v1/models", None, AUTH),
        ("POST", "/v1/chat/completions", CHAT, {**AUTH, **JSON}),
        ("POST", "/v1/completions", b"{}", {"Authorization": f"Bearer {key}", **JSON}),
    ]:
        status, text = call(gateway.port, method, path, body, {**headers, "Host": host})
        assert status == 421, (path, text)
        assert json.loads(text)["error"]["type"] == "invalid_request_error"
        assert "DNS rebinding" in text
    assert gateway.engine.calls == []


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST:1234", "[::1]:80", "10.1.2.3:8100"])
def test_loopback_names_and_addresses_are_this_gateway(gateway: SimpleNamespace, host: str) -> None:
    status, text = call(gateway.port, "GET", "/v1/models", None, {**AUTH, "Host": host})
    assert status == 200 and json.loads(text)["data"][0]["id"] == "tiny"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_post_that_is_not_json_is_refused_unread(
    gateway: SimpleNamespace, content_type: str | None
) -> None:
    """A ``no-cors`` fetch from a web page can only send these content types (or none); with the
    run's secret or a rollout key alike."""
    key = gateway.thread.call(lambda: gateway.capture.open(f"r-{content_type}")).key
    typed = {"Content-Type": content_type} if content_type else {}
    for credential in (SECRET, key):
        headers = {"Authorization": f"Bearer {credential}", **typed}
        status, text = call(gateway.port, "POST", "/v1/chat/completions", CHAT, headers)
        assert status == 415, text
        assert "application/json" in json.loads(text)["error"]["message"]
    assert gateway.engine.calls == []


def test_json_with_the_secret_passes_the_doors(gateway: SimpleNamespace) -> None:
    """The control: the same request as JSON reaches the route (which answers for the model)."""
    status, text = call(gateway.port, "POST", "/v1/chat/completions", CHAT, {**AUTH, **JSON})
    assert status == 404 and "model 'other' is not served here" in text
    status, text = call(gateway.port, "POST", "/v1/chat/completions", CHAT, JSON)
    assert status == 401 and "run secret" in text
