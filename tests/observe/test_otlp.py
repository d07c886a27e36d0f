"""OTLP receiver: protobuf and JSON exports from vLLM-shaped spans, looked up by request id."""

from __future__ import annotations

import gzip
import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from telescope.core.cluster.run_secret import ENV_VAR, auth_headers
from telescope.core.observe.samplers.otlp import OtlpReceiver
from telescope.core.observe.samplers.otlp_wire import OtlpDecodeError, spans_from_protobuf

SECRET = "otlp-secret-" + "9" * 40


@pytest.fixture(autouse=True)
def run_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Receivers take the run's secret from the environment, as in a run."""
    monkeypatch.setenv(ENV_VAR, SECRET)


# --- a minimal protobuf encoder, written independently of the decoder under test ---------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _attr(key: str, value: object) -> bytes:
    if isinstance(value, str):
        any_value = _len_field(1, value.encode())
    elif isinstance(value, bool):
        any_value = _varint(2 << 3) + _varint(int(value))
    elif isinstance(value, int):
        any_value = _varint(3 << 3) + _varint(value)
    else:
        any_value = _varint(4 << 3 | 1) + struct.pack("<d", value)
    return _len_field(9, _len_field(1, key.encode()) + _len_field(2, any_value))


def _export(spans: list[dict]) -> bytes:
    span_bytes = b""
    for s in spans:
        body = _len_field(1, bytes.fromhex("ab" * 16)) + _len_field(2, bytes.fromhex("cd" * 8))
        body += _len_field(5, s["name"].encode())
        start_ns, end_ns = s.get("ns", (1_000, 5_000))
        body += (
            _varint(7 << 3 | 1)
            + struct.pack("<Q", start_ns)
            + _varint(8 << 3 | 1)
            + struct.pack("<Q", end_ns)
        )
        body += b"".join(_attr(k, v) for k, v in s["attributes"].items())
        span_bytes += _len_field(2, body)
    scope_spans = _len_field(1, _len_field(1, b"vllm")) + span_bytes  # scope, then spans
    resource_spans = _len_field(1, b"") + _len_field(2, scope_spans)
    return _len_field(1, resource_spans)


VLLM_SPAN = {
    "name": "llm_request",
    "attributes": {
        "gen_ai.request.id": "cmpl-42-0",
        "gen_ai.latency.time_in_queue": 0.01,
        "gen_ai.latency.time_to_first_token": 0.25,
        "gen_ai.latency.e2e": 1.5,
        "gen_ai.request.max_tokens": 512,
        "gen_ai.usage.prompt_tokens": -3,
        "stream": True,
    },
}


def test_decode_protobuf_export() -> None:
    (span,) = spans_from_protobuf(_export([VLLM_SPAN]))
    assert span["name"] == "llm_request" and span["trace_id"] == "ab" * 16 and span["span_id"] == "cd" * 8
    assert (span["start_ns"], span["end_ns"]) == (1_000, 5_000)
    assert span["attributes"] == VLLM_SPAN["attributes"]
    with pytest.raises(OtlpDecodeError):
        spans_from_protobuf(_export([VLLM_SPAN])[:-3])


def _post(port: int, body: bytes, ctype: str, encoding: str = "", extra: dict[str, str] | None = None) -> int:
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    headers.update(auth_headers() if extra is None else extra)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_receiver_over_http_protobuf_gzip_json_and_lookup(otlp_json: Callable[..., dict[str, Any]]) -> None:
    rx = OtlpReceiver(port=0)
    for issued in ("42", "7", "late"):
        rx.expect(issued)
    rx.start()
    try:
        assert _post(rx.port, gzip.compress(_export([VLLM_SPAN])), "application/x-protobuf", "gzip") == 200
        assert rx.timings("cmpl-42") == {
            "queue_time": 0.01,
            "ttft": 0.25,
            "e2e_latency": 1.5,
            "max_tokens": 512.0,
        }
        doc = otlp_json(
            ("gen_ai.request.id", "stringValue", "cmpl-7"),
            ("gen_ai.latency.time_in_model_decode", "doubleValue", 0.5),
            ("gen_ai.request.max_tokens", "intValue", "64"),
        )
        assert _post(rx.port, json.dumps(doc).encode(), "application/json") == 200
        assert rx.timings("cmpl-7") == {"decode_time": 0.5, "max_tokens": 64.0}
        assert _post(rx.port, b"\xff\xff", "application/x-protobuf") == 400 and rx.bad_requests == 1
        t0 = time.monotonic()
        assert rx.lookup("never", wait_s=0.05) is None and time.monotonic() - t0 >= 0.05
        # a span arriving while a lookup waits is returned (the exporter flushes in batches)
        late = {"name": "x", "attributes": {"gen_ai.request.id": "late"}}
        threading.Timer(0.05, lambda: rx.ingest(_export([late]))).start()
        assert rx.lookup("late", wait_s=5)["name"] == "x"
    finally:
        rx.stop()


def test_capacity_and_ttl() -> None:
    rx = OtlpReceiver(port=0, max_spans=2, ttl_s=3600)
    for i in range(3):
        rx.expect(f"r{i}")
    for i in range(3):
        rx.ingest(_export([{"name": "s", "attributes": {"gen_ai.request.id": f"r{i}"}}]))
    assert rx.lookup("r0", wait_s=0) is None and rx.lookup("r2", wait_s=0) is not None
    rx.stop()


def traced_sample(ids: list[str], server: int = -1, lane: int = -1) -> Any:
    """A finished sample whose requests got the response ids ``ids`` (one per turn)."""
    from telescope.core.rollouts.groups import RolloutSample

    return RolloutSample(
        prompt_ids=[1],
        completion_ids=[2],
        inference_logprobs=[0.0],
        loss_mask=None,
        finish_reason="stop",
        reward=1.0,
        raw_reward=1.0,
        timings={"generation_s": 1.0},
        server=server,
        lane=lane,
        response_ids=ids,
    )


def test_each_rollouts_vllm_timings_join_its_record_by_response_id() -> None:
    from telescope.core.rollouts.groups import RolloutGroup
    from telescope.core.runtime.reporting import StepRollouts

    def span(request_id: str, queue: float, ttft: float, decode: float) -> dict:
        return {
            "name": "llm_request",
            "attributes": {
                "gen_ai.request.id": request_id,
                "gen_ai.latency.time_in_queue": queue,
                "gen_ai.latency.time_to_first_token": ttft,
                "gen_ai.latency.time_in_model_decode": decode,
                "gen_ai.request.max_tokens": 64,
            },
        }

    collected = StepRollouts()
    rx = OtlpReceiver(port=0)
    for issued in ("a", "b", "c"):
        rx.expect(issued)
    collected.traces = rx
    try:
        # vLLM names a completion's span "<response id>-<prompt index>"
        rx.ingest(
            _export(
                [
                    span("cmpl-a-0", 0.5, 0.25, 2.0),
                    span("cmpl-b-0", 0.125, 0.5, 1.0),
                    span("cmpl-c-0", 0.25, 0.75, 3.0),
                ]
            )
        )
        group = RolloutGroup(
            group_id=0,
            env_name="e",
            sample_idx=0,
            samples=[
                traced_sample(["cmpl-a"]),
                traced_sample(["cmpl-b", "cmpl-c"]),
                traced_sample(["cmpl-none"]),
            ],
        )
        collected.add(group, step=1)
        rollouts = collected.close(1, {})
    finally:
        rx.stop()
    single, two_turns, unseen = (r.timings for r in rollouts)
    assert single == {"generation_s": 1.0, "vllm_queue_time": 0.5, "vllm_ttft": 0.25, "vllm_decode_time": 2.0}
    # turns add up; time to first token is the first turn's
    assert two_turns == {
        "generation_s": 1.0,
        "vllm_queue_time": 0.375,
        "vllm_ttft": 0.5,
        "vllm_decode_time": 4.0,
    }
    assert unseen == {"generation_s": 1.0}


def test_oversized_and_bomb_exports_are_refused_before_any_work() -> None:
    """A 64 KB gzip body that inflates to 64 MB used to cost the driver seconds of CPU and GBs of memory."""
    from telescope.core.observe.samplers import otlp

    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))
    assert len(bomb) < 128 * 1024
    rx = OtlpReceiver(port=0)
    rx.expect("42")
    rx.start()
    try:
        assert _post(rx.port, bomb, "application/x-protobuf", "gzip") == 400
        with socket.create_connection(("127.0.0.1", rx.port), timeout=5) as conn:  # announce, never send
            conn.sendall(
                f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {SECRET}\r\n"
                f"Content-Type: application/x-protobuf\r\nContent-Length: {otlp.MAX_BODY_BYTES + 1}\r\n\r\n".encode()
            )
            assert conn.recv(64).startswith(b"HTTP/1.0 413")
        assert rx.bad_requests == 2
        assert _post(rx.port, gzip.compress(_export([VLLM_SPAN])), "application/x-protobuf", "gzip") == 200
    finally:
        rx.stop()


def test_an_export_without_the_run_secret_or_from_a_foreign_host_is_refused_unread() -> None:
    """Finding 8: anyone who reached the port could fill the receiver."""
    rx = OtlpReceiver(port=0)
    rx.expect("42")
    rx.start()
    body = _export([VLLM_SPAN])
    try:
        for headers, status in (
            ({}, 401),
            ({"Authorization": "Bearer wrong"}, 401),
            ({**auth_headers(), "Host": "evil.example"}, 421),
        ):
            assert _post(rx.port, body, "application/x-protobuf", extra=headers) == status
        assert _post(rx.port, body, "text/plain") == 415
        assert rx.bad_requests == 4 and rx.lookup("cmpl-42", wait_s=0) is None
        assert _post(rx.port, body, "application/x-protobuf") == 200
        assert rx.lookup("cmpl-42", wait_s=0) is not None
    finally:
        rx.stop()


def test_only_spans_of_requests_the_run_issued_are_kept() -> None:
    """Finding 8: spans of ids the run never sent used to be stored (and evicted the run's own)."""
    rx = OtlpReceiver(port=0, max_spans=2)
    rx.expect("step3-g1-s0")
    rx.expect("step3-g1-s1-t2")  # a multi-turn sample's third turn
    names = ["cmpl-step3-g1-s0-0", "cmpl-step3-g1-s1-t2-0", "cmpl-step3-g1-0", "cmpl-other-0", "step3"]
    rx.ingest(_export([{"name": n, "attributes": {"gen_ai.request.id": n}} for n in names]))
    assert rx.foreign_spans == 3
    assert rx.lookup("cmpl-step3-g1-s0", wait_s=0)["name"] == names[0]
    assert rx.lookup("cmpl-step3-g1-s1-t2", wait_s=0)["name"] == names[1]
    assert rx.lookup("cmpl-other", wait_s=0) is None and rx.lookup("cmpl-step3-g1", wait_s=0) is None
    rx.stop()


def test_vllms_exporter_sends_the_secret_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real OTLP/HTTP exporter vLLM builds (``OTLPSpanExporter(endpoint=...)``), configured only by the
    variables the run gives vLLM's process (build_vllm_env, build_vllm_secret_env)."""
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from telescope.core.inference.vllm_engine.args import build_vllm_secret_env

    for name, template in build_vllm_secret_env(tracing=True).items():
        monkeypatch.setenv(name, template.format(secret=SECRET))
    rx = OtlpReceiver(port=0)
    rx.expect("r-1")
    rx.start()
    provider = TracerProvider()
    try:
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{rx.port}/v1/traces"))
        )
        with provider.get_tracer("vllm").start_as_current_span("llm_request") as span:
            span.set_attribute("gen_ai.request.id", "cmpl-r-1-0")
            span.set_attribute("gen_ai.latency.time_to_first_token", 0.5)
        assert rx.timings("cmpl-r-1", wait_s=5) == {"ttft": 0.5}
        assert rx.bad_requests == 0
    finally:
        provider.shutdown()
        rx.stop()


def test_the_vllm_client_announces_each_request_before_sending_it() -> None:
    import asyncio

    from telescope.core.inference.vllm_engine.client import VllmClient

    seen: list[str] = []
    client = VllmClient("http://127.0.0.1:9", on_request=seen.append)

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        seen.append(f"sent {kwargs['json']['request_id']}")
        raise OSError("no server")

    client._request = refuse  # type: ignore[method-assign]
    with pytest.raises(OSError):
        asyncio.run(client.complete([1, 2], request_id="s0-t1"))
    assert seen == ["s0-t1", "sent s0-t1"]


def test_each_request_of_a_step_is_put_on_the_timeline_with_its_samples_ids() -> None:
    from telescope.core.observe.rundir.records import TimelineEvent
    from telescope.core.rollouts.groups import RolloutGroup
    from telescope.core.runtime.reporting import StepRollouts

    rx = OtlpReceiver(port=0)
    events: list[TimelineEvent] = []
    collected = StepRollouts()
    collected.trace(rx, events.append)
    try:
        for issued in ("a", "b", "c", "none"):
            rx.expect(issued)
        for rid, t0, t1 in (("cmpl-a-0", 10.0, 11.0), ("cmpl-b-0", 10.5, 12.0), ("cmpl-c-0", 12.5, 13.0)):
            attrs = {"gen_ai.request.id": rid, "gen_ai.latency.e2e": t1 - t0}
            rx.ingest(
                _export([{"name": "llm_request", "attributes": attrs, "ns": (int(t0 * 1e9), int(t1 * 1e9))}])
            )
        group = RolloutGroup(
            group_id=4,
            env_name="e",
            sample_idx=0,
            samples=[
                traced_sample(["cmpl-a"], 0, 3),
                traced_sample(["cmpl-b", "cmpl-c"], 1, 0),
                traced_sample(["cmpl-none"], 0, 1),
            ],
        )
        collected.add(group, step=2)
        rows = collected.close(2, {})
    finally:
        rx.stop()
    drawn = [
        (e.phase, e.time, e.step, e.group_id, e.sample_id, e.server, e.lane, e.attrs.get("turn"))
        for e in events
    ]
    assert drawn == [
        ("start", 10.0, 2, 4, 0, 0, 3, None),
        ("end", 11.0, 2, 4, 0, 0, 3, 0),
        ("start", 10.5, 2, 4, 1, 1, 0, None),  # a two-turn rollout: one span per turn
        ("end", 12.0, 2, 4, 1, 1, 0, 0),
        ("start", 12.5, 2, 4, 1, 1, 0, None),
        ("end", 13.0, 2, 4, 1, 1, 0, 1),
    ]  # the third sample's span never came: nothing drawn, no timings
    assert [r.timings.get("vllm_e2e_latency") for r in rows] == [1.0, 2.0, None]


def test_a_span_exported_just_after_its_step_closed_still_joins_its_record() -> None:
    """vLLM exports every 200 ms: a request that finished just before a fast step closed has no span
    yet when the close looks; the close waits for it (up to ``SPAN_GRACE_S`` for the whole step)."""
    import threading

    from telescope.core.rollouts.groups import RolloutGroup
    from telescope.core.runtime.reporting import SPAN_GRACE_S, StepRollouts

    rx = OtlpReceiver(port=0)
    collected = StepRollouts()
    collected.trace(rx, lambda _event: None)
    rx.expect("late")
    attrs = {"gen_ai.request.id": "cmpl-late-0", "gen_ai.latency.e2e": 0.5}
    export = threading.Timer(
        SPAN_GRACE_S / 4, lambda: rx.ingest(_export([{"name": "x", "attributes": attrs}]))
    )
    try:
        collected.add(
            RolloutGroup(group_id=0, env_name="e", sample_idx=0, samples=[traced_sample(["cmpl-late"])]), 1
        )
        export.start()
        (row,) = collected.close(1, {})
    finally:
        export.cancel()
        rx.stop()
    assert row.timings.get("vllm_e2e_latency") == 0.5
