"""Request bodies of the gateway's OpenAI routes (pydantic, no heavy imports).

Fields follow OpenAI's API, plus vLLM's extensions that clients send through ``extra_body``
(``stop_token_ids``, ``chat_template``, ``chat_template_kwargs``, ``return_token_ids``, ...).
Unknown fields are refused (400 naming the field), so a setting is never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from telescope.core.inference.protocol import MAX_N, MAX_SEED, MAX_TOP_LOGPROBS

__all__ = [
    "ChatCompletionsBody",
    "ChatMessageIn",
    "CompletionsBody",
    "StreamOptions",
    "ToolSpec",
]

#: Most stop strings a request may give (OpenAI's limit is 4; vLLM takes more).
MAX_STOP_STRINGS = 16


class StreamOptions(BaseModel):
    """``stream_options`` of a streamed request."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    include_usage: bool = False
    """Send one last chunk with the request's token usage (and no choices)."""


class _Sampling(BaseModel):
    """Fields both routes share."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str
    """The served model's id (``GET /v1/models``); another name is answered 404."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    """Choices per prompt."""
    temperature: float = Field(default=1.0, ge=0, le=2)
    """Sampling temperature; 0 = greedy."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass; 1 = disabled."""
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    """Sampling seed (choice i samples with ``seed + i``): the same request gives the same choices."""
    stop: str | list[str] | None = None
    """Stop strings: a choice ends where one appears; the text is cut before it (its tokens are kept in
    ``token_ids``, so what is trained is what was sampled)."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a choice (vLLM's extension; the token is kept)."""
    stream: bool = False
    """Answer as server-sent events, one chunk per token (sent once the choices are generated)."""
    stream_options: StreamOptions | None = None
    """Options of a streamed answer."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (vLLM's extension)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text."""
    return_token_ids: bool = False
    """Add ``prompt_token_ids`` and each choice's ``token_ids`` to the answer (vLLM's extension)."""
    return_tokens_as_token_ids: bool = False
    """Name the tokens of ``logprobs`` ``token_id:<id>`` instead of their text (vLLM's extension: two
    alternatives that decode to the same text stay apart)."""
    user: str | None = None
    """End-user id (recorded nowhere; accepted for compatibility)."""
    frequency_penalty: float = 0.0
    """Not supported: only 0 (a penalty changes the sampled distribution the trainer reproduces)."""
    presence_penalty: float = 0.0
    """Not supported: only 0 (as ``frequency_penalty``)."""

    def stop_strings(self) -> list[str]:
        """``stop`` as a list (empty strings dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return [s for s in stops if s]


class CompletionsBody(_Sampling):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    """Text, texts, token ids, or lists of token ids (text is tokenized without special tokens)."""
    max_tokens: int = Field(default=16, ge=1)
    """Most tokens per choice."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Return each token's logprob and the ``logprobs`` most likely alternatives (0: the token's only)."""
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """vLLM's extension: each choice's ``prompt_logprobs`` holds, per prompt token after the first,
    ``{"<id>": {"logprob": ...}}`` of that token (and this many alternatives) under the model's own
    distribution; the first entry is null. How a run asks ``telescope serve`` to be its teacher."""
    echo: bool = False
    """Not supported: only false (the prompt is not repeated in the text)."""
    suffix: str | None = None
    """Not supported (no insertion mode)."""


class ToolFunction(BaseModel):
    """A function a tool exposes."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    name: str
    """The function's name, as the model calls it."""
    description: str | None = None
    """What it does (rendered into the prompt by the chat template)."""
    parameters: dict[str, Any] | None = None
    """JSON schema of its arguments."""


class ToolSpec(BaseModel):
    """One entry of ``tools``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["function"] = "function"
    """Only function tools exist."""
    function: ToolFunction
    """The function."""


class ChatMessageIn(BaseModel):
    """One message of ``messages``."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who speaks (``developer`` is rendered as ``system``)."""
    content: str | list[dict[str, Any]] | None = None
    """Text, or a list of ``{"type": "text", "text": ...}`` parts (other part types are refused)."""
    name: str | None = None
    """Optional speaker name."""
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant message's calls, as OpenAI returned them."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""
    reasoning_content: str | None = None
    """An assistant message's reasoning, for templates that render it."""


class ChatCompletionsBody(_Sampling):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    """The conversation so far."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens per choice (default: what the context leaves, up to the gateway's ``max_tokens``)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's newer name of ``max_tokens`` (the smaller of the two wins)."""
    logprobs: bool = False
    """Return each token's logprob."""
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """With ``logprobs``: the most likely alternatives per token."""
    tools: list[ToolSpec] | None = None
    """Functions the model may call; calls in its output come back as ``tool_calls``."""
    tool_choice: Literal["auto", "none"] | dict[str, Any] | str | None = None
    """``auto`` (default with tools) or ``none`` (no parsing). ``required`` and a named function are
    refused: the gateway does not constrain decoding."""
    parallel_tool_calls: bool = True
    """Several calls per answer are allowed (false: only the first is returned)."""
    chat_template: str | None = None
    """A Jinja chat template replacing the tokenizer's (and the gateway's default) for this request."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the chat template (e.g. ``{"enable_thinking": false}``)."""
    enable_thinking: bool | None = None
    """Shorthand for ``chat_template_kwargs.enable_thinking`` (default: the gateway's setting)."""
    add_generation_prompt: bool = True
    """End the prompt with the assistant's header."""
    continue_final_message: bool = False
    """Leave the last (assistant) message open, so the model continues it."""
    response_format: dict[str, Any] | None = None
    """Only ``{"type": "text"}`` (no constrained decoding)."""
