"""The prompt source (``runtime.prompts``): which prompt is served next, with the prefetch on."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes import ToyEnv

from telescope.core.env.chat import ChatOptions
from telescope.core.rollouts.prompts import PromptSource
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv


def test_a_requeued_prompt_is_served_before_the_prefetched_ones(tokenizer: Any) -> None:
    env = ToyEnv(lambda completion, sample: 0.0)
    env.samples()
    prompts = PromptSource(
        PromptScheduler([SourceEnv("toy", 1.0, len(env))], seed=0),
        {"toy": env},
        {"toy": (None, None)},
        tokenizer,
        ChatOptions(),
        prefetch=3,
    )

    async def serve() -> list[int]:
        await prompts.start()
        first = await prompts.next()
        for _ in range(3000):  # until the buffer is full again (the prefetch waits on it)
            if prompts._queue is not None and prompts._queue.full():
                break
            await asyncio.sleep(0.01)
        assert prompts._queue is not None and prompts._queue.full(), "the prefetch did not refill in 30 s"
        prompts.requeue([first.item])  # its server was drained
        served = [first.item.group_id] + [(await prompts.next()).item.group_id for _ in range(4)]
        await prompts.stop()
        return served

    served = asyncio.run(serve())
    # group ids follow the draw order: 1-3 were prefetched while 0 ran; 0 comes again first
    assert served == [0, 0, 1, 2, 3]
    assert [i.group_id for i in prompts.outstanding()] == [0, 1, 2, 3, 4]  # none lost (4: in the prefetch)
