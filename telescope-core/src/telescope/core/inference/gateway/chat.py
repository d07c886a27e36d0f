"""Chat on the gateway: messages to prompt token ids, and the model's text back to an OpenAI message.

Prompts are rendered by the tokenizer's chat template (``env.chat.render_messages``, the same
renderer the environments use); the gateway tokenizes the text, reusing a rollout's sampled ids
where the text continues them (``capture.reuse_sampled_ids``). Tool calls are read out of the sampled text by
the parsers the tool environments use (``env.tool_calls``): ``xml`` is Hermes/Qwen's
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, ``python`` is ``name(arg=1)`` calls of
the request's tools.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from telescope.core.env.chat import ChatOptions, render_messages
from telescope.core.env.tool_calls import ParsedToolCalls, parse_function_calls, parse_xml_tool_calls
from telescope.core.inference.gateway.errors import BadRequest
from telescope.core.inference.gateway.schema import ChatCompletionsBody, ChatMessageIn

__all__ = ["ParsedMessage", "parse_message", "render_chat", "template_messages"]

ToolCallParser = Literal["xml", "python"]
_XML_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL | re.IGNORECASE)


def _text_of(message: ChatMessageIn, index: int) -> str | None:
    """A message's content as text (text parts joined); other part types are refused."""
    if message.content is None or isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(
                f"messages[{index}].content has a part of type {part.get('type')!r}; only text parts "
                '({"type": "text", "text": ...}) are supported',
                param=f"messages[{index}].content",
            )
        texts.append(part["text"])
    return "".join(texts)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its ``arguments`` JSON string parsed (templates render a dict)."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # kept as the model wrote it
    return {**call, "function": function}


def template_messages(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
    """The request's messages as chat templates take them."""
    out = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": _text_of(message, i) or "",
        }
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(message, key) is not None:
                entry[key] = getattr(message, key)
        if message.tool_calls:
            entry["tool_calls"] = [_template_call(c) for c in message.tool_calls]
        out.append(entry)
    return out


def render_chat(tokenizer: Any, body: ChatCompletionsBody, default: ChatOptions) -> str:
    """The prompt text of a chat request (the chat template's output)."""
    kwargs = dict(body.chat_template_kwargs or {})
    thinking = kwargs.pop("enable_thinking", body.enable_thinking)
    chat = ChatOptions(
        enable_thinking=default.enable_thinking if thinking is None else bool(thinking),
        chat_template=body.chat_template or default.chat_template,
    )
    tools = [t.function.model_dump(exclude_none=True) for t in body.tools or ()]
    try:
        text = render_messages(
            tokenizer,
            template_messages(body.messages),
            chat,
            continue_final_message=body.continue_final_message,
            tools=[{"type": "function", "function": t} for t in tools] or None,
            template_kwargs=kwargs,
        )
    except BadRequest:
        raise
    except Exception as exc:  # noqa: BLE001 - a template error is the request's (Jinja raises many types)
        raise BadRequest(
            f"the chat template could not render these messages: {type(exc).__name__}: {exc}",
            param="messages",
        ) from None
    return text


@dataclass
class ParsedMessage:
    """The assistant message read out of a choice's text."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _calls(text: str, parser: ToolCallParser, names: list[str]) -> ParsedToolCalls:
    return parse_xml_tool_calls(text) if parser == "xml" else parse_function_calls(text, names)


def parse_message(
    text: str, tool_names: list[str] | None, parser: ToolCallParser, parallel: bool = True
) -> ParsedMessage:
    """``text`` as content plus ``tool_calls`` (only when the request gave tools; the call text is taken
    out of the content; malformed calls stay in the content, where the agent can see them)."""
    if not tool_names:
        return ParsedMessage(content=text)
    parsed = _calls(text, parser, tool_names)
    if not parsed.calls:
        return ParsedMessage(content=text)
    calls = parsed.calls if parallel else parsed.calls[:1]
    content = text
    if parser == "xml":
        content = _XML_BLOCK.sub("", content)
    else:
        for call in parsed.calls:
            content = content.replace(call.raw_text, "", 1)
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in calls
    ]
    return ParsedMessage(content=content.strip() or None, tool_calls=tool_calls)
