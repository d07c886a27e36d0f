"""Parsing tool calls out of model text. Parsers never raise: bad calls become errors.

Two formats: XML ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and Python
function-call syntax ``add(a=1, b=2)`` (literal arguments only, parsed with ``ast``).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_CALL_CHARS", "ParsedToolCalls", "ToolCall", "parse_function_calls", "parse_xml_tool_calls"]

#: A single call longer than this is rejected unparsed (bounded parser work per call).
MAX_CALL_CHARS = 20_000
_XML_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL | re.IGNORECASE)
_IDENT = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


@dataclass
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_text: str = ""


@dataclass
class ParsedToolCalls:
    """Calls that parsed, and one message per call that did not (sent back to the model)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def attempted(self) -> bool:
        """True when the text tried to call a tool (even if every attempt was malformed)."""
        return bool(self.calls or self.errors)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _call_from_json(raw: str) -> ToolCall | str:
    """A ToolCall, or an error message describing why ``raw`` is not one."""
    if len(raw) > MAX_CALL_CHARS:
        return f"tool call too long ({len(raw)} chars > {MAX_CALL_CHARS})"
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return f"malformed tool call JSON ({type(exc).__name__}: {_clip(str(exc), 120)}): {_clip(raw)}"
    if not isinstance(obj, dict):
        return f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got: {_clip(raw)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"tool call without a 'name' string: {_clip(raw)}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return f"tool '{name}': 'arguments' is a string that is not JSON: {_clip(str(args))}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f"tool '{name}': 'arguments' must be an object, got {type(args).__name__}"
    return ToolCall(name=name.strip(), arguments=args, raw_text=raw)


def parse_xml_tool_calls(text: str) -> ParsedToolCalls:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order."""
    out = ParsedToolCalls()
    try:
        for match in _XML_CALL.finditer(str(text)):
            parsed = _call_from_json(match.group(1))
            if isinstance(parsed, ToolCall):
                out.calls.append(parsed)
            else:
                out.errors.append(parsed)
        if not out.attempted and re.search(r"<tool_call>", str(text), re.IGNORECASE):
            out.errors.append("unterminated <tool_call>: close it with </tool_call>")
    except Exception as exc:  # noqa: BLE001 - the parser never raises
        out.errors.append(f"could not parse tool calls: {type(exc).__name__}")
    return out


def _balanced_call(text: str, open_pos: int) -> int | None:
    """Index just past the ``)`` matching the ``(`` at ``open_pos``, honouring quotes."""
    depth, i, quote = 0, open_pos, ""
    while i < len(text):
        if quote:
            if text.startswith("\\", i):
                i += 2
                continue
            if text.startswith(quote, i):
                i, quote = i + len(quote), ""
                continue
        elif text.startswith(('"""', "'''"), i):
            quote = text[i : i + 3]
            i += 3
            continue
        elif text[i] in "\"'":
            quote = text[i]
        elif text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _call_from_python(name: str, call_text: str) -> ToolCall | str:
    if len(call_text) > MAX_CALL_CHARS:
        return f"tool call too long ({len(call_text)} chars > {MAX_CALL_CHARS})"
    try:
        node = ast.parse(call_text, mode="eval").body
        if not isinstance(node, ast.Call):
            return f"not a function call: {_clip(call_text)}"
        args: dict[str, Any] = {str(i): ast.literal_eval(a) for i, a in enumerate(node.args)}
        for kw in node.keywords:
            if kw.arg is None:
                return f"tool '{name}': **kwargs are not supported: {_clip(call_text)}"
            args[kw.arg] = ast.literal_eval(kw.value)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        return f"tool '{name}': arguments must be literals ({type(exc).__name__}): {_clip(call_text)}"
    return ToolCall(name=name, arguments=args, raw_text=call_text)


def parse_function_calls(text: str, tool_names: set[str] | list[str]) -> ParsedToolCalls:
    """Calls ``name(...)`` of known tools in ``text``; positional args get keys "0", "1", ..."""
    out = ParsedToolCalls()
    names = set(tool_names)
    try:
        text, pos = str(text), 0
        while True:
            match = _IDENT.search(text, pos)
            if match is None:
                break
            pos = match.end()
            if match.group(1) not in names:
                continue
            end = _balanced_call(text, match.end() - 1)
            if end is None:
                out.errors.append(f"tool '{match.group(1)}': unbalanced parentheses")
                break
            call_text = match.group(1) + text[match.end() - 1 : end]
            parsed = _call_from_python(match.group(1), call_text)
            (out.calls if isinstance(parsed, ToolCall) else out.errors).append(parsed)  # type: ignore[arg-type]
            pos = end
    except Exception as exc:  # noqa: BLE001 - the parser never raises
        out.errors.append(f"could not parse tool calls: {type(exc).__name__}")
    return out
