"""Prompt preparation with optional prefetch: scheduled, rendered and tokenized ahead of use."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from telescope.core.env.base import MultiTurnEnvironment
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import Sample
from telescope.core.runtime.scheduler import PromptItem, PromptScheduler

__all__ = ["PreparedPrompt", "PromptSource"]


@dataclass
class PreparedPrompt:
    """A scheduled prompt, rendered through the chat template and tokenized."""

    item: PromptItem
    env: Any
    sample: Sample
    prompt_text: str
    prompt_ids: list[int]
    reward_min: float | None
    reward_max: float | None


class PromptSource:
    """Hands out prepared prompts; with prefetch a background task keeps a buffer full."""

    def __init__(
        self, scheduler: PromptScheduler, envs: dict[str, Any], ranges: dict[str, tuple[float | None, float | None]],
        tokenizer: Any, chat: ChatOptions, prefetch: int,
    ) -> None:  # fmt: skip
        self.scheduler = scheduler
        self.envs = envs
        self.ranges = ranges
        self.tokenizer = tokenizer
        self.chat = chat
        self.prefetch = prefetch
        self._queue: asyncio.Queue[PreparedPrompt] | None = None
        self._task: asyncio.Task[None] | None = None

    def prepare(self, item: PromptItem) -> PreparedPrompt:
        """Render and tokenize one scheduled prompt."""
        env = self.envs[item.env_name]
        sample = env.get_sample(item.sample_idx)
        if isinstance(env, MultiTurnEnvironment):
            text = env.format_messages(env.get_initial_prompt(sample), self.tokenizer, self.chat)
        else:
            text = env.format_prompt(sample, self.tokenizer, self.chat)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        lo, hi = self.ranges.get(item.env_name, (None, None))
        return PreparedPrompt(item, env, sample, text, ids, lo, hi)

    async def start(self) -> None:
        if self.prefetch > 0:
            self._queue = asyncio.Queue(maxsize=self.prefetch)
            self._task = asyncio.create_task(self._fill(), name="prompt-prefetch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _fill(self) -> None:
        assert self._queue is not None
        while True:
            item = self.scheduler.next()
            prepared = await asyncio.to_thread(self.prepare, item)
            await self._queue.put(prepared)

    async def next(self) -> PreparedPrompt:
        """The next prompt (from the prefetch buffer when enabled)."""
        if self._queue is not None:
            if self._task is not None and self._task.done():
                self._task.result()  # surface a failure in preparation
            prepared = await self._queue.get()
        else:
            prepared = await asyncio.to_thread(self.prepare, self.scheduler.next())
        return prepared
