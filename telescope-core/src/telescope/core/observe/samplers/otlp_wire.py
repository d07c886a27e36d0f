"""Decode OTLP trace exports (protobuf wire format or OTLP/JSON) into plain span dicts.

A small hand-written protobuf reader for the few messages involved, so no
opentelemetry-proto dependency: ExportTraceServiceRequest(1: ResourceSpans) ->
ResourceSpans(2: ScopeSpans) -> ScopeSpans(2: Span) -> Span(1 trace_id, 2 span_id,
5 name, 7/8 start/end_time_unix_nano, 9 attributes: KeyValue(1 key, 2 AnyValue)).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

__all__ = ["OtlpDecodeError", "spans_from_json", "spans_from_protobuf"]


class OtlpDecodeError(ValueError):
    """The body is not a valid OTLP trace export."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise OtlpDecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise OtlpDecodeError("varint longer than 64 bits")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field number, wire type, value)``; LEN values are bytes, fixed ones raw bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise OtlpDecodeError(f"unsupported wire type {wire} in field {num}")
        if pos > len(buf):
            raise OtlpDecodeError(f"field {num} runs past the end of the message")
        yield num, wire, value


def _any_value(buf: bytes) -> Any:
    for num, _wire, value in _fields(buf):
        if num == 1:
            return value.decode("utf-8", errors="replace")
        if num == 2:
            return bool(value)
        if num == 3:
            return value - (1 << 64) if value >= 1 << 63 else value  # int64 two's complement
        if num == 4:
            return struct.unpack("<d", value)[0]
        if num == 7:
            return bytes(value)
    return None  # arrays and kv-lists are not used by vLLM's request spans


def _span(buf: bytes) -> dict[str, Any]:
    span: dict[str, Any] = {
        "name": "",
        "trace_id": "",
        "span_id": "",
        "start_ns": 0,
        "end_ns": 0,
        "attributes": {},
    }
    for num, _wire, value in _fields(buf):
        if num in (1, 2):
            span["trace_id" if num == 1 else "span_id"] = bytes(value).hex()
        elif num == 5:
            span["name"] = value.decode("utf-8", errors="replace")
        elif num in (7, 8):
            span["start_ns" if num == 7 else "end_ns"] = struct.unpack("<Q", value)[0]
        elif num == 9:
            key, val = "", None
            for knum, _w, kval in _fields(value):
                if knum == 1:
                    key = kval.decode("utf-8", errors="replace")
                elif knum == 2:
                    val = _any_value(kval)
            span["attributes"][key] = val
    return span


def spans_from_protobuf(body: bytes) -> list[dict[str, Any]]:
    """Every span of an ``ExportTraceServiceRequest`` (``application/x-protobuf``)."""
    spans: list[dict[str, Any]] = []
    for num, _w, resource_spans in _fields(body):
        if num != 1:
            continue
        for rnum, _w2, scope_spans in _fields(resource_spans):
            if rnum != 2:
                continue
            spans.extend(_span(v) for snum, _w3, v in _fields(scope_spans) if snum == 2)
    return spans


def _json_value(value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])  # OTLP/JSON writes int64 as a string
    return None


def spans_from_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every span of an OTLP/JSON export (``application/json``)."""
    spans: list[dict[str, Any]] = []
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                spans.append(
                    {
                        "name": s.get("name", ""),
                        "trace_id": s.get("traceId", ""),
                        "span_id": s.get("spanId", ""),
                        "start_ns": int(s.get("startTimeUnixNano", 0)),
                        "end_ns": int(s.get("endTimeUnixNano", 0)),
                        "attributes": {
                            a["key"]: _json_value(a.get("value", {})) for a in s.get("attributes", [])
                        },
                    }
                )
    return spans
