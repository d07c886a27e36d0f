"""Split a rollout's prompt and completion text into chat messages and tool-call parts.

Records keep the text as the model saw it (the chat template applied), so the roles come from
the template's markers: ChatML (``<|im_start|>role``) and Llama 3 (``<|start_header_id|>role
<|end_header_id|>``). Text with no marker is one message of the default role. Inside a message,
``<tool_call>``/``<tool_response>`` blocks (the ToolEnvironment's default tags) become their
own parts so the page can show tool calls and results apart from prose.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["conversation", "split_messages", "split_parts"]

_ROLE_MARK = re.compile(r"<\|im_start\|>(\w+)\n?|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*")
_END_MARKS = re.compile(r"<\|im_end\|>\n?|<\|eot_id\|>|<\|begin_of_text\|>|<\|endoftext\|>")
_TOOL_BLOCK = re.compile(r"<(tool_call|tool_response)>(.*?)</\1>", re.S)


def split_parts(text: str) -> list[dict[str, str]]:
    """``[{"kind": "text"|"tool_call"|"tool_result", "text": ...}]`` in order."""
    parts, pos = [], 0
    for match in _TOOL_BLOCK.finditer(text):
        if text[pos : match.start()].strip():
            parts.append({"kind": "text", "text": text[pos : match.start()]})
        kind = "tool_call" if match.group(1) == "tool_call" else "tool_result"
        parts.append({"kind": kind, "text": match.group(2).strip()})
        pos = match.end()
    if text[pos:].strip() or not parts:
        parts.append({"kind": "text", "text": text[pos:]})
    return parts


def split_messages(text: str, default_role: str) -> list[dict[str, Any]]:
    """Messages ``{"role", "parts"}`` of one templated text (see module doc)."""
    marks = list(_ROLE_MARK.finditer(text))
    chunks: list[tuple[str, str]] = []
    head = text[: marks[0].start()] if marks else text
    if head.strip() or not marks:
        chunks.append((default_role, head))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        chunks.append((mark.group(1) or mark.group(2), text[mark.end() : end]))
    messages = []
    for role, body in chunks:
        body = _END_MARKS.sub("", body)
        if body.strip() or role == default_role:
            messages.append({"role": role, "parts": split_parts(body.strip("\n"))})
    return messages


def conversation(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt's messages then the completion's (assistant by default)."""
    prompt = split_messages(str(record.get("prompt_text") or ""), "user")
    completion = split_messages(str(record.get("completion_text") or ""), "assistant")
    for message in completion:
        message["generated"] = True
    return [m for m in prompt if any(p["text"].strip() for p in m["parts"])] + completion
