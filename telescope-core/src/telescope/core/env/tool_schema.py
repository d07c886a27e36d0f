"""Python functions to OpenAI tool schemas (types from hints, text from docstrings)."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["argument_errors", "func_to_tool_schema", "parse_docstring"]

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$"
)
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r":param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google- or Sphinx-style docstring into (description, {param: description})."""
    if not doc:
        return "", {}
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    base_indent: int | None = None
    for line in inspect.cleandoc(doc).splitlines():
        sphinx = _SPHINX.match(line.strip())
        header = _SECTION.match(line)
        if sphinx:
            current, section = sphinx.group(1), "args"
            params[current] = sphinx.group(2).strip()
        elif header:
            section = "args" if header.group(1).lower().startswith(("arg", "param")) else "other"
            current, base_indent = None, None
        elif section is None:
            summary.append(line)
        elif section == "args" and line.strip():
            indent = len(line) - len(line.lstrip())
            base_indent = indent if base_indent is None else base_indent
            match = _ARG_LINE.match(line)
            if match and indent <= base_indent:
                current = match.group(1)
                params[current] = match.group(3).strip()
            elif current is not None:
                params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), params


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return _json_type(non_none[0]) if len(non_none) == 1 else {"type": "string"}
    if origin is typing.Literal:
        values = list(args)
        base = _json_type(type(values[0])) if values else {"type": "string"}
        return {**base, "enum": values}
    if origin in (list, tuple, set, frozenset) or hint in (tuple, set):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _json_type(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    return {"type": "string"}


def func_to_tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI ``{"type": "function", "function": {...}}`` schema of ``func``.

    Parameter types come from type hints (unhinted or unknown types become strings);
    a parameter without a default is required; descriptions come from the docstring,
    including per-parameter ones from an ``Args:`` section or ``:param x:`` lines.
    """
    description, param_docs = parse_docstring(func.__doc__)
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: fall back to no hints
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.name in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(param.name, str))
        if param.name in param_docs:
            prop["description"] = param_docs[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_JSON_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list | tuple),
    "object": lambda v: isinstance(v, dict),
}


def _value_errors(name: str, value: Any, schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type")
    if kind in _JSON_CHECKS and not _JSON_CHECKS[kind](value):
        return [
            f"'{name}' must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {type(value).__name__} {value!r}"
        ]
    if "enum" in schema and value not in schema["enum"]:
        return [f"'{name}' must be one of {schema['enum']}, got {value!r}"]
    if kind == "array" and "items" in schema:
        return [
            e for i, item in enumerate(value) for e in _value_errors(f"{name}[{i}]", item, schema["items"])
        ]
    return []


def argument_errors(func: Callable[..., Any], schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Why ``arguments`` do not fit the tool's JSON schema (empty when they do).

    Only type-hinted parameters are checked (an unhinted one accepts anything); ``None`` is
    accepted where the hint allows it; digit keys are positional arguments.
    """
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: nothing to check against
        return []
    names = [n for n in inspect.signature(func).parameters if n not in ("self", "cls")]
    properties = schema["function"]["parameters"]["properties"]
    errors: list[str] = []
    for key, value in arguments.items():
        name = names[int(key)] if key.isdigit() and int(key) < len(names) else key
        if name not in hints or name not in properties:
            continue
        if value is None and type(None) in typing.get_args(hints[name]):
            continue
        errors += _value_errors(name, value, properties[name])
    return errors
