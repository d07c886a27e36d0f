"""OTLP/HTTP receiver for vLLM request traces (``enable_vllm_tracing``, ``otlp_receiver_port``).

vLLM exports one span per request with ``gen_ai.request.id`` and latency attributes; when a step
is logged, each of its rollouts' requests is looked up by id: its timings join the rollout's
``timings`` and the span itself becomes a ``vllm_request`` span on the run's timeline
(``request_span_events``). The driver starts the receiver before the servers (vLLM exports its
own loading spans from its first second; a receiver started later refused them) and, when
``otlp_receiver_port`` is taken, on a free port the servers are then launched with.

Bodies are capped before any work: at most ``MAX_BODY_BYTES`` on the wire (413 unread above it)
and ``MAX_DECODED_BYTES`` once gunzipped (a small gzip bomb used to cost seconds of the driver's
CPU and gigabytes of memory). Before that, an export must carry the run's secret (vLLM's exporter
sends it from ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``) and a Host naming this machine
(``cluster.http_guard``). Only spans of request ids the run issued (``expect``) are kept: anyone else's
spans would evict the run's and give its rollouts made-up timings.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
import zlib
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from telescope.core.cluster.http_guard import refusal
from telescope.core.observe.rundir.records import TimelineEvent
from telescope.core.observe.samplers.otlp_wire import OtlpDecodeError, spans_from_json, spans_from_protobuf

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DECODED_BYTES",
    "VLLM_REQUEST_EVENT",
    "VLLM_TIMING_ATTRIBUTES",
    "OtlpReceiver",
    "request_span_events",
    "span_timings",
]

#: Largest export body read from the wire (vLLM batches spans; a batch is a few hundred KB).
MAX_BODY_BYTES = 8 * 1024 * 1024
#: Largest body after gunzip.
MAX_DECODED_BYTES = 32 * 1024 * 1024
#: Request ids remembered as issued (the oldest are forgotten first; a step issues a few thousand).
MAX_ISSUED = 200_000


class _TooLarge(ValueError):
    """An export over ``MAX_BODY_BYTES`` or ``MAX_DECODED_BYTES``."""


_log = logging.getLogger("telescope.observe")

#: span attribute -> rollout timing name (seconds; max_tokens is a count).
VLLM_TIMING_ATTRIBUTES = {
    "gen_ai.latency.time_in_queue": "queue_time",
    "gen_ai.latency.time_to_first_token": "ttft",
    "gen_ai.latency.time_in_model_prefill": "prefill_time",
    "gen_ai.latency.time_in_model_decode": "decode_time",
    "gen_ai.latency.time_in_model_inference": "inference_time",
    "gen_ai.latency.e2e": "e2e_latency",
    "gen_ai.request.max_tokens": "max_tokens",
}
#: span attribute -> token count in a ``vllm_request`` timeline span's attrs.
VLLM_TOKEN_ATTRIBUTES = {
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "completion_tokens",
}
#: The timeline event type of a vLLM request (``request_span_events``).
VLLM_REQUEST_EVENT = "vllm_request"


class OtlpReceiver:
    """Threaded HTTP server on ``host:port`` accepting ``POST /v1/traces``.

    Keeps at most ``max_spans`` spans with a ``gen_ai.request.id``, each for ``ttl_s``.
    ``port=0`` picks a free port (read ``.port``).
    """

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        ttl_s: float = 120.0,
        max_spans: int = 10_000,
        *,
        secret: str | None = None,
    ) -> None:
        """``secret``: what exports must carry (default: the run's, ``TELESCOPE_RUN_SECRET``)."""
        from telescope.core.cluster.run_secret import current_run_secret

        self.secret = secret if secret is not None else current_run_secret()
        self.host = host
        self._spans: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._issued: OrderedDict[str, None] = OrderedDict()
        self._cond = threading.Condition()
        self._ttl, self._max = ttl_s, max_spans
        self.bad_requests = 0
        """Exports refused: undecodable, too large, without the secret or with a foreign Host."""
        self.foreign_spans = 0
        """Spans dropped because their request id was never issued by the run."""
        self.request_spans = 0
        """Spans kept: those of requests the run issued."""
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="telescope-otlp", daemon=True)

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> OtlpReceiver:
        """Loopback, or every interface when the inference servers do (servers on other nodes send here).

        On ``otlp_receiver_port``, or on a free port when another program (another run's receiver)
        holds it: read ``.port`` and launch the servers with it.
        """
        wildcard = str(cfg.inference_host) in ("0.0.0.0", "::", "")
        host = "0.0.0.0" if wildcard else "127.0.0.1"
        try:
            return cls(port=int(cfg.otlp_receiver_port), host=host)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        receiver = cls(port=0, host=host)
        _log.warning(
            "otlp_receiver_port %d on %s is in use: the run's OTLP receiver listens on %d instead "
            "(its vLLM servers export there)",
            cfg.otlp_receiver_port,
            host,
            receiver.port,
        )
        return receiver

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                refused = refusal(
                    "POST",
                    self.path.split("?", 1)[0],
                    self.headers.get,
                    secret=receiver.secret,
                    bound_host=receiver.host,
                    open_paths=(),
                    what="the run's OTLP receiver",
                    content_types=("application/x-protobuf", "application/json"),
                )
                if refused is not None:
                    receiver.refused(f"{refused.status} {refused.message}")
                    body = refused.message.encode()
                    self.send_response(refused.status)
                    for name, value in refused.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body)
                    self.close_connection = True
                    return
                try:
                    length = int(self.headers.get("Content-Length", 0))
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY_BYTES:
                    receiver.refused(f"Content-Length {self.headers.get('Content-Length')!r}")
                    self.send_response(413 if length > MAX_BODY_BYTES else 400)
                    self.send_header("Content-Length", "0")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    return
                body = self.rfile.read(length)
                ok = self.path.rstrip("/") == "/v1/traces" and receiver.ingest(
                    body, self.headers.get("Content-Type", ""), self.headers.get("Content-Encoding", "")
                )
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # keep stderr quiet
                pass

        return Handler

    def ingest(self, body: bytes, content_type: str = "application/x-protobuf", encoding: str = "") -> bool:
        """Store the spans of one export; False (counted) when the body cannot be decoded."""
        try:
            if len(body) > MAX_BODY_BYTES:
                raise _TooLarge(f"{len(body)} bytes")
            if encoding == "gzip":
                body = _gunzip_capped(body)
            if "json" in content_type:
                spans = spans_from_json(json.loads(body))
            else:
                spans = spans_from_protobuf(body)
        except (OtlpDecodeError, ValueError, OSError) as exc:
            self.refused(f"undecodable: {exc}")
            return False
        now = time.monotonic()
        with self._cond:
            for span in spans:
                rid = span["attributes"].get("gen_ai.request.id")
                if rid is None:
                    continue
                if not self._was_issued(str(rid)):
                    self.foreign_spans += 1
                    continue
                self._spans[str(rid)] = (now, span)
                self._spans.move_to_end(str(rid))
                self.request_spans += 1
            self._evict(now)
            self._cond.notify_all()
        return True

    def refused(self, why: str) -> None:
        """Count a refused export; the first is logged (a server exporting without the run's secret,
        or to a foreign Host, loses every span: said once, not silently)."""
        self.bad_requests += 1
        if self.bad_requests == 1:
            _log.warning(
                "the run's OTLP receiver refused a trace export (%s); later refusals are only counted", why
            )

    def expect(self, request_id: str) -> None:
        """``request_id`` was sent by the run: keep its spans (the client calls this before sending)."""
        with self._cond:
            self._issued[request_id] = None
            self._issued.move_to_end(request_id)
            while len(self._issued) > MAX_ISSUED:
                self._issued.popitem(last=False)

    def _was_issued(self, span_id: str) -> bool:
        """Whether a span's request id belongs to an issued request: vLLM names it
        ``cmpl-<request id>-<prompt index>`` (request ids may hold dashes themselves)."""
        rid = span_id.removeprefix("cmpl-")
        if rid in self._issued or span_id in self._issued:
            return True
        return any(rid[:i] in self._issued for i, char in enumerate(rid) if char == "-")

    def _evict(self, now: float) -> None:
        while self._spans and (
            len(self._spans) > self._max or now - next(iter(self._spans.values()))[0] > self._ttl
        ):
            self._spans.popitem(last=False)

    def lookup(self, request_id: str, wait_s: float = 0.3) -> dict[str, Any] | None:
        """The span of ``request_id`` (tried as ``"{id}-0"``, then bare), waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                for key in (f"{request_id}-0", str(request_id)):
                    if key in self._spans:
                        return self._spans[key][1]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def timings(self, request_id: str, wait_s: float = 0.3) -> dict[str, float]:
        """``VLLM_TIMING_ATTRIBUTES`` of the request's span, renamed; ``{}`` when not seen."""
        span = self.lookup(request_id, wait_s)
        return {} if span is None else span_timings(span)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: only when it runs
            self._server.shutdown()
        self._server.server_close()


def span_timings(span: dict[str, Any]) -> dict[str, float]:
    """``VLLM_TIMING_ATTRIBUTES`` of a decoded span, renamed (those it has)."""
    attrs = span["attributes"]
    return {name: float(attrs[key]) for key, name in VLLM_TIMING_ATTRIBUTES.items() if key in attrs}


def request_span_events(span: dict[str, Any], turn: int, **ids: Any) -> list[TimelineEvent]:
    """A vLLM request span as a timeline span: ``vllm_request`` from the request's arrival at vLLM
    to its end there, with the ids of its sample (``step``, ``group_id``, ``sample_id``, ``server``,
    ``lane``). The end's attrs: ``request_id``, ``turn`` (of a multi-turn rollout), the timings of
    ``span_timings`` but ``max_tokens`` (seconds) and the token counts. ``[]`` for a span without
    times."""
    start_ns, end_ns = int(span.get("start_ns") or 0), int(span.get("end_ns") or 0)
    if start_ns <= 0 or end_ns < start_ns:
        return []
    attrs = span["attributes"]
    details: dict[str, Any] = {"request_id": str(attrs.get("gen_ai.request.id", "")), "turn": turn}
    details.update((k, v) for k, v in span_timings(span).items() if k != "max_tokens")
    details.update((name, int(attrs[key])) for key, name in VLLM_TOKEN_ATTRIBUTES.items() if key in attrs)
    return [
        TimelineEvent(VLLM_REQUEST_EVENT, "start", time=start_ns / 1e9, **ids),
        TimelineEvent(VLLM_REQUEST_EVENT, "end", time=end_ns / 1e9, attrs=details, **ids),
    ]


def _gunzip_capped(body: bytes) -> bytes:
    """``gzip.decompress`` that stops at ``MAX_DECODED_BYTES`` instead of inflating a bomb."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, MAX_DECODED_BYTES + 1)
    if len(out) > MAX_DECODED_BYTES or inflater.unconsumed_tail:
        raise _TooLarge(f"more than {MAX_DECODED_BYTES} bytes once decompressed")
    if not inflater.eof:
        raise ValueError("truncated gzip body")
    return out
