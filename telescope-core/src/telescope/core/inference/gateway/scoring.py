"""``prompt_logprobs`` through the gateway: asked of the engine, returned in vLLM's wire form.

So ``telescope serve`` can be another run's teacher (on-policy distillation), exactly as a vLLM
server would: the logprob of every given prompt token under the served model.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prompt_logprobs_param", "wire_prompt_logprobs"]


def prompt_logprobs_param(prompt_logprobs: int | None) -> dict[str, Any]:
    """The engine request's extra field (none when the client did not ask)."""
    return {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}


def wire_prompt_logprobs(
    rows: list[dict[int, float] | None] | None,
) -> list[dict[str, dict[str, float]] | None]:
    """``{id: logprob}`` per prompt position -> ``{"<id>": {"logprob": ...}}`` (null where nothing predicts)."""
    if rows is None:
        raise ValueError("the engine answered without prompt_logprobs although they were asked for")
    return [None if row is None else {str(i): {"logprob": v} for i, v in row.items()} for row in rows]
