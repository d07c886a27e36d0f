"""Tokenizer helpers for rollouts: stop tokens and exact token reuse across turns.

Multi-turn rollouts never re-tokenize what the model already produced: the next turn's
prompt is the previous prompt ids + the completion ids exactly as generated + the
template's end-of-turn suffix (only the part the completion did not already emit) + the
environment's message rendered on its own. The trained sequence is therefore exactly the
token stream the model saw and produced.
"""

from __future__ import annotations

from typing import Any

from telescope.core.env.chat import ChatOptions, render_messages

__all__ = ["Interleaver", "stop_token_ids", "strip_stop"]

_BASE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
]


def stop_token_ids(tokenizer: Any, generation_eos: list[int] | int | None = None) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS, the generation config's, and ChatML's end."""
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, generation_eos):
        for tid in value if isinstance(value, list) else [value]:
            if isinstance(tid, int) and tid not in ids:
                ids.append(tid)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if isinstance(im_end, int) and im_end not in ids:
        ids.append(im_end)
    if not ids:
        raise ValueError("the tokenizer defines no EOS token: set one (eos_token) so completions can end")
    return ids


class Interleaver:
    """Builds each turn's prompt ids from the previous ones, with no re-tokenization."""

    def __init__(self, tokenizer: Any, chat: ChatOptions) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.suffix_ids = self._assistant_suffix_ids()
        # The base conversation without a generation prompt: env turns are rendered after it
        # and only the delta is kept, so system-prompt defaults never leak into env tokens.
        self._base_text = str(
            tokenizer.apply_chat_template(
                _BASE, tokenize=False, add_generation_prompt=False, **self._template_kwargs()
            )
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (the template already has them)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _assistant_suffix_ids(self) -> list[int]:
        """The tokens a template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        marker = "World!"
        msgs = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": marker}]
        text = str(self.tokenizer.apply_chat_template(msgs, tokenize=False, **self._template_kwargs()))
        return self.encode(text[text.rindex(marker) + len(marker) :])

    def env_ids(self, env_messages: list[dict[str, Any]]) -> list[int]:
        """The environment's messages rendered after a fixed base, with the next generation prompt."""
        rendered = render_messages(self.tokenizer, [*_BASE, *env_messages], self.chat)
        if not rendered.startswith(self._base_text):
            raise ValueError("the chat template renders earlier messages differently when more are added")
        return self.encode(rendered[len(self._base_text) :])

    def _template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"enable_thinking": self.chat.enable_thinking}
        if self.chat.chat_template is not None:
            kwargs["chat_template"] = self.chat.chat_template
        return kwargs

    def bridge(self, completion_ids: list[int]) -> list[int]:
        """The part of the end-of-turn suffix the completion did not already emit."""
        suffix = self.suffix_ids
        for overlap in range(min(len(suffix), len(completion_ids)), 0, -1):
            if completion_ids[-overlap:] == suffix[:overlap]:
                return suffix[overlap:]
        return list(suffix)


def strip_stop(text: str, eos: str) -> str:
    """``text`` without the stop text ``eos`` it ends with (the decoded completion as messages keep it)."""
    return text[: -len(eos)] if eos and text.endswith(eos) else text
