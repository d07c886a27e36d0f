"""Rendering message lists through a tokenizer's chat template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from telescope.core.env.types import ChatMessage

__all__ = ["ChatConfig", "ChatOptions", "render_messages"]


class ChatConfig(Protocol):
    """The run-config fields ``ChatOptions.from_config`` reads: a ``TelescopeConfig`` (``env`` sits
    below ``config`` in the layers, so it names the fields rather than importing the class)."""

    @property
    def enable_thinking(self) -> bool: ...

    @property
    def chat_template(self) -> str | None: ...


@dataclass(frozen=True)
class ChatOptions:
    """The config fields that change how prompts are rendered.

    ``enable_thinking`` is always passed to the template (templates that ignore it are
    unaffected); ``chat_template`` replaces the tokenizer's own template when set.
    """

    enable_thinking: bool = False
    chat_template: str | None = None

    @classmethod
    def from_config(cls, cfg: ChatConfig) -> ChatOptions:
        """Read ``enable_thinking`` and ``chat_template`` from a ``TelescopeConfig``."""
        return cls(enable_thinking=cfg.enable_thinking, chat_template=cfg.chat_template)


def render_messages(
    tokenizer: Any,
    messages: list[ChatMessage],
    chat: ChatOptions | None = None,
    *,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render ``messages`` to the prompt text the model continues.

    With ``continue_final_message`` the last (assistant) message stays open, so the model
    continues it (the thinking-prefix mode); otherwise a generation prompt is added. ``tools``
    (OpenAI function schemas) and ``template_kwargs`` go to the template as it takes them.
    """
    if tokenizer is None:
        raise ValueError("rendering a prompt needs a tokenizer (got None)")
    chat = chat or ChatOptions()
    kwargs: dict[str, Any] = {"enable_thinking": chat.enable_thinking, **(template_kwargs or {})}
    if tools:
        kwargs["tools"] = tools
    if chat.chat_template is not None:
        kwargs["chat_template"] = chat.chat_template
    elif getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template: set `chat_template` in the config "
            "(required for base models without one)"
        )
    clean = [{k: v for k, v in m.items() if k != "turn_type"} for m in messages]
    text = tokenizer.apply_chat_template(
        clean,
        tokenize=False,
        add_generation_prompt=not continue_final_message,
        continue_final_message=continue_final_message,
        **kwargs,
    )
    return str(text)
