"""Streamed answers: a finished OpenAI response cut into the chunks OpenAI streams.

Each token's chunk carries the text it added (incremental detokenisation as vLLM does it, so a
character split over several tokens arrives whole) and its logprobs; joined, the chunks' texts are
exactly the non-streamed answer's text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["chat_chunks", "completion_chunks", "text_deltas"]


def text_deltas(tokenizer: Any, ids: list[int], text: str, skip_special_tokens: bool = True) -> list[str]:
    """Per token of ``ids``, the part of ``text`` it adds (``text``: the choice's answer, maybe cut at a
    stop string); the parts joined are ``text``."""
    raw: list[str] = []
    prefix, read = 0, 0
    for k in range(len(ids)):
        before = tokenizer.decode(ids[prefix:read], skip_special_tokens=skip_special_tokens)
        after = tokenizer.decode(ids[prefix : k + 1], skip_special_tokens=skip_special_tokens)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            raw.append(after[len(before) :])
            prefix, read = read, k + 1
        else:
            raw.append("")
    deltas, at = [], 0
    for piece in raw:
        deltas.append(text[at : at + len(piece)])
        at += len(deltas[-1])
    if deltas:
        deltas[-1] += text[at:]
    return deltas


def _head(response: dict[str, Any], obj: str) -> dict[str, Any]:
    return {"id": response["id"], "object": obj, "created": response["created"], "model": response["model"]}


def _usage_chunk(response: dict[str, Any], obj: str, body: Any) -> list[dict[str, Any]]:
    if body.stream_options is None or not body.stream_options.include_usage:
        return []
    return [{**_head(response, obj), "choices": [], "usage": response["usage"]}]


def completion_chunks(
    response: dict[str, Any], token_ids: list[list[int]], tokenizer: Any, body: Any
) -> list[dict[str, Any]]:
    """The chunks of a ``text_completion`` answer (``token_ids``: each choice's sampled ids)."""
    chunks = []
    head = _head(response, "text_completion")
    for choice, ids in zip(response["choices"], token_ids, strict=True):
        deltas = text_deltas(tokenizer, ids, choice["text"], body.skip_special_tokens)
        logprobs = choice["logprobs"]
        for k, delta in enumerate(deltas):
            part: dict[str, Any] = {"index": choice["index"], "text": delta, "logprobs": None}
            if logprobs is not None:
                part["logprobs"] = {
                    "tokens": logprobs["tokens"][k : k + 1],
                    "token_logprobs": logprobs["token_logprobs"][k : k + 1],
                    "top_logprobs": logprobs["top_logprobs"][k : k + 1] if logprobs["top_logprobs"] else None,
                    "text_offset": logprobs["text_offset"][k : k + 1],
                }
            part["finish_reason"] = choice["finish_reason"] if k == len(deltas) - 1 else None
            chunks.append({**head, "choices": [part]})
    return chunks + _usage_chunk(response, "text_completion", body)


def chat_chunks(
    response: dict[str, Any], token_ids: list[list[int]], tokenizer: Any, body: Any
) -> list[dict[str, Any]]:
    """The chunks of a ``chat.completion`` answer: the role, content deltas per token (or the content
    and then the tool calls, when the choice called tools), then the finish reason."""
    chunks = []
    head = _head(response, "chat.completion.chunk")

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None, logprobs: Any = None) -> None:
        part = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        chunks.append({**head, "choices": [part]})

    for choice, ids in zip(response["choices"], token_ids, strict=True):
        index, message = choice["index"], choice["message"]
        chunk(index, {"role": "assistant", "content": ""})
        entries = choice["logprobs"]["content"] if choice["logprobs"] else None
        if message.get("tool_calls"):
            if message["content"]:
                chunk(
                    index, {"content": message["content"]}, logprobs={"content": entries} if entries else None
                )
            calls = [{"index": j, **call} for j, call in enumerate(message["tool_calls"])]
            chunk(index, {"tool_calls": calls})
        else:
            deltas = text_deltas(tokenizer, ids, message["content"] or "", body.skip_special_tokens)
            for k, delta in enumerate(deltas):
                chunk(
                    index, {"content": delta}, logprobs={"content": entries[k : k + 1]} if entries else None
                )
        chunk(index, {}, choice["finish_reason"])
    return chunks + _usage_chunk(response, "chat.completion.chunk", body)
