"""vLLM's request traces reach the run: the receiver listens before the servers start, on the port the
servers are launched with, and each request's span becomes a ``vllm_request`` span on the timeline.

The real exporter and server are in tests/runtime/test_vllm_cpu_observability.py (``vllm_cpu``).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from telescope.core.cluster.run_secret import ENV_VAR, auth_headers
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.observe import LoggerHub
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.samplers.otlp import OtlpReceiver, request_span_events
from telescope.core.testing import make_config

SECRET = "traces-secret-" + "5" * 40


@pytest.fixture(autouse=True)
def run_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, SECRET)


def _span_json(
    request_id: str, start_s: float, end_s: float, attrs: dict[str, float] | None = None
) -> dict[str, Any]:
    """One vLLM ``llm_request`` span as OTLP/JSON (written by hand: times in ns, int64 as strings)."""
    values = [{"key": "gen_ai.request.id", "value": {"stringValue": request_id}}]
    for key, value in (attrs or {}).items():
        kind = {"intValue": str(value)} if isinstance(value, int) else {"doubleValue": value}
        values.append({"key": f"gen_ai.{key}", "value": kind})
    span = {
        "name": "llm_request",
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "startTimeUnixNano": str(int(start_s * 1e9)),
        "endTimeUnixNano": str(int(end_s * 1e9)),
        "attributes": values,
    }
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def _post(port: int, doc: dict[str, Any], timeout_s: float = 5.0) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", **auth_headers()},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        return int(resp.status)


def test_a_request_span_becomes_a_timeline_span_of_its_sample() -> None:
    rx = OtlpReceiver(port=0)
    rx.expect("7")  # the request id the client sent; vLLM names the completion cmpl-7, its span cmpl-7-0
    doc = _span_json(
        "cmpl-7-0",
        1000.25,
        1001.75,
        {
            "latency.time_in_queue": 0.5,
            "latency.time_to_first_token": 0.75,
            "latency.e2e": 1.5,
            "request.max_tokens": 24,
            "usage.prompt_tokens": 33,
            "usage.completion_tokens": 12,
        },
    )
    assert rx.ingest(json.dumps(doc).encode(), "application/json")
    span = rx.lookup("cmpl-7", wait_s=0)
    assert span is not None
    start, end = request_span_events(span, 1, step=3, group_id=2, sample_id=5, server=0, lane=7)
    ids = {"step": 3, "group_id": 2, "sample_id": 5, "server": 0, "lane": 7}
    assert (start.type, start.phase, end.type, end.phase) == ("vllm_request", "start", "vllm_request", "end")
    assert start.time == pytest.approx(1000.25) and end.time == pytest.approx(1001.75)
    for event in (start, end):
        assert {k: getattr(event, k) for k in ids} == ids
    assert end.attrs == {
        "request_id": "cmpl-7-0",
        "turn": 1,
        "queue_time": 0.5,
        "ttft": 0.75,
        "e2e_latency": 1.5,
        "prompt_tokens": 33,
        "completion_tokens": 12,
    }
    # a span without times (nothing to draw) gives no events
    assert request_span_events({**span, "start_ns": 0}, 0) == []


def test_the_receiver_listens_before_the_servers_start_on_the_port_they_are_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM exports spans from its first second (its loading spans); the driver's receiver used to start
    after the servers were up, refusing them. Here the configured port is also held by another
    program: the receiver takes a free one and the servers are launched with that."""
    from telescope.core.inference import auto
    from telescope.core.inference.vllm_engine.args import otlp_endpoint
    from telescope.core.runtime import driver

    monkeypatch.setattr(auto, "tracing_unavailable_reason", lambda: None)  # the OTel SDK, as vLLM has it
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # another run's receiver, say: accepts and never answers
    cfg = make_config(use_wandb=False, enable_vllm_tracing=True, otlp_receiver_port=taken.getsockname()[1])
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path / "run", system_metrics=False, ticker=False)

    class Stop(BaseException):
        pass

    class Session:
        """The servers' side of ``RunSession.start``: they export to the endpoint built from its config."""

        def __init__(self) -> None:
            self.cfg, self.traces, self.sent = cfg, None, -1

        def start(self) -> None:
            url = otlp_endpoint(self.cfg, "127.0.0.1")
            assert url is not None
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            try:
                self.sent = _post(port, _span_json("Overall Loading", 1.0, 2.0), timeout_s=2)
            except (urllib.error.URLError, TimeoutError):
                self.sent = 0
            raise Stop

    session = Session()
    try:
        with pytest.raises(Stop):
            engine = VllmEngine(cfg, VllmEngineKwargs())  # its servers export traces
            driver._train_recovering([session], hub, None, engine)  # type: ignore[list-item, arg-type]
    finally:
        hub.finish("finished")
        taken.close()
    assert session.sent == 200
    assert session.traces is not None and session.traces.port != cfg.otlp_receiver_port
    assert session.cfg.otlp_receiver_port == session.traces.port
