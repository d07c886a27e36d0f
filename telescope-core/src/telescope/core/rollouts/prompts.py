"""Prompt preparation with optional prefetch, and the ledger of prompts not yet trained on.

Every prompt drawn from the scheduler stays *outstanding* until the orchestrator resolves it
(its group was trained, or discarded). A checkpoint stores the scheduler state together with
the outstanding prompts; a resumed run serves those first (same group ids, so the same
per-request seeds), then continues the scheduler — no prompt is lost or repeated.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from telescope.core.env.base import Environment, MultiTurnEnvironment, SingleTurnEnvironment
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import Sample
from telescope.core.errors import stage_error
from telescope.core.rollouts.scheduler import PromptItem, PromptScheduler

__all__ = ["PreparedPrompt", "PromptSource"]


@dataclass
class PreparedPrompt:
    """A scheduled prompt, rendered through the chat template and tokenized."""

    item: PromptItem
    env: Environment
    sample: Sample
    prompt_text: str
    prompt_ids: list[int]
    reward_min: float | None
    reward_max: float | None


@dataclass(eq=False)
class PromptSource:
    """Hands out prepared prompts; with prefetch a background task keeps a buffer full."""

    scheduler: PromptScheduler
    envs: dict[str, Environment]
    ranges: dict[str, tuple[float | None, float | None]]
    """Each environment's declared reward range (min, max), recorded with its prompts."""
    tokenizer: Any
    chat: ChatOptions
    prefetch: int
    """How many prepared prompts the background task keeps ready (0: prepared on demand)."""
    _queue: asyncio.Queue[PreparedPrompt] | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _outstanding: dict[int, PromptItem] = field(default_factory=dict, init=False, repr=False)
    _requeued: deque[PromptItem] = field(default_factory=deque, init=False, repr=False)

    # --- the ledger ----------------------------------------------------------------------
    def _draw(self, requeued: bool = True) -> PromptItem:
        """A re-queued prompt first (unless ``requeued`` is False), else the scheduler's next."""
        item = self._requeued.popleft() if requeued and self._requeued else self.scheduler.next()
        self._outstanding[item.group_id] = item
        return item

    def resolve(self, group_ids: list[int]) -> None:
        """These groups were trained on or discarded: their prompts are used up."""
        for gid in group_ids:
            self._outstanding.pop(gid, None)

    def requeue(self, items: list[PromptItem]) -> None:
        """Serve these prompts again before new ones (a drained server's groups, a resume)."""
        for item in sorted(items, key=lambda i: i.group_id, reverse=True):
            self._outstanding.pop(item.group_id, None)
            self._requeued.appendleft(item)

    def outstanding(self) -> list[PromptItem]:
        """Prompts drawn but not yet resolved, plus those waiting to be served again."""
        items = {i.group_id: i for i in [*self._outstanding.values(), *self._requeued]}
        return [items[g] for g in sorted(items)]

    def state_dict(self) -> dict[str, Any]:
        """Scheduler position plus the outstanding prompts (JSON-ready)."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "outstanding": [asdict(i) for i in self.outstanding()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``: outstanding prompts are served first, in group-id order."""
        self.scheduler.load_state_dict(state["scheduler"])
        self._outstanding.clear()
        self._requeued = deque(
            PromptItem(**i) for i in sorted(state["outstanding"], key=lambda i: i["group_id"])
        )

    def prepare(self, item: PromptItem) -> PreparedPrompt:
        """Render and tokenize one scheduled prompt; a failure names the environment and sample."""
        try:
            return self._prepare(item)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the environment and sample
            stage = f"prompt preparation (environment '{item.env_name}', sample {item.sample_idx})"
            raise stage_error(stage, exc) from None

    def _prepare(self, item: PromptItem) -> PreparedPrompt:
        env = self.envs[item.env_name]
        sample = env.get_sample(item.sample_idx)
        if isinstance(env, MultiTurnEnvironment):
            text = env.format_messages(env.get_initial_prompt(sample), self.tokenizer, self.chat)
        else:  # every other environment is single-turn
            text = cast(SingleTurnEnvironment, env).format_prompt(sample, self.tokenizer, self.chat)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        lo, hi = self.ranges.get(item.env_name, (None, None))
        return PreparedPrompt(item, env, sample, text, ids, lo, hi)

    async def start(self, on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Start the prefetch task (when enabled); ``on_failure`` hears at once if it fails."""
        if self.prefetch > 0:
            self._queue = asyncio.Queue(maxsize=self.prefetch)
            self._task = asyncio.create_task(self._fill(), name="prompt-prefetch")
            if on_failure is not None:
                self._task.add_done_callback(
                    lambda t: on_failure(t.exception()) if not t.cancelled() and t.exception() else None  # type: ignore[arg-type]
                )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _fill(self) -> None:
        assert self._queue is not None
        while True:
            item = self._draw(requeued=False)  # re-queued prompts are served by ``next``, in their order
            prepared = await asyncio.to_thread(self.prepare, item)
            await self._queue.put(prepared)

    async def next(self) -> PreparedPrompt:
        """The next prompt: a re-queued one first, else from the prefetch buffer when enabled; raises the
        prefetch's failure."""
        if self._queue is None or self._task is None or self._requeued:
            # Re-queued prompts (a drained server's groups) go before those prefetched since: they
            # were drawn earlier, and the longer they wait the likelier they are too old to train on.
            return await asyncio.to_thread(self.prepare, self._draw())
        if self._queue.empty() and not self._task.done():
            # Wait for the next prompt *or* the end of the prefetch task: a failure of
            # prepare() while the buffer is empty must not leave the caller waiting forever.
            getter = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()
        if not self._queue.empty():
            return self._queue.get_nowait()
        self._task.result()  # surface a failure in preparation
        raise RuntimeError("the prompt prefetch task stopped without an error (was it stopped?)")
