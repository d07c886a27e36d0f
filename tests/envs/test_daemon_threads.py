"""The daemon thread pool that runs blocking rewards and tools off the event loop
(``telescope.core.env.threads``): results, errors, hung calls, several loops, batched wake-ups."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import pytest

from telescope.core.env.threads import DaemonThreadPool


def test_every_call_gets_its_own_result_or_error_back() -> None:
    pool = DaemonThreadPool(max_workers=4)

    def square_or_fail(x: int) -> int:
        if x % 7 == 3:
            raise ValueError(f"bad {x}")
        return x * x

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(pool.run(square_or_fail, x) for x in range(300)), return_exceptions=True
        )

    results = asyncio.run(main())
    for x, got in enumerate(results):
        if x % 7 == 3:
            assert isinstance(got, ValueError) and str(got) == f"bad {x}"
        else:
            assert got == x * x
    assert pool._workers <= 4


def test_a_hung_call_times_out_and_the_others_still_run() -> None:
    pool = DaemonThreadPool(max_workers=2)
    release = threading.Event()

    async def main() -> tuple[bool, list[int]]:
        timed_out = False
        try:
            async with asyncio.timeout(0.2):
                await pool.run(release.wait)
        except TimeoutError:
            timed_out = True
        others = await asyncio.gather(*(pool.run(lambda v=v: v + 1) for v in range(20)))
        return timed_out, others

    timed_out, others = asyncio.run(main())
    release.set()  # the abandoned call returns later: its result is dropped, nothing raises
    time.sleep(0.1)
    assert timed_out and others == list(range(1, 21))


def test_results_finished_together_wake_the_loop_once_not_once_each() -> None:
    pool = DaemonThreadPool(max_workers=4)
    wakes = 0

    async def main() -> list[int]:
        nonlocal wakes
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        tasks = [asyncio.ensure_future(pool.run(lambda v=v: v * 2)) for v in range(50)]
        await asyncio.sleep(0)  # every call is queued for the workers
        time.sleep(0.5)  # the loop is busy while the workers finish all 50
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [v * 2 for v in range(50)]
    assert 1 <= wakes <= 2, wakes  # one hand-over for the batch (a second if a worker raced the drain)


@pytest.mark.parametrize("runs", [3])
def test_each_event_loop_gets_its_results_and_a_finished_loop_is_not_kept(runs: int) -> None:
    pool = DaemonThreadPool(max_workers=2)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main(k: int) -> int:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return sum(await asyncio.gather(*(pool.run(lambda v=v: v + k) for v in range(10))))

    assert [asyncio.run(main(k)) for k in range(runs)] == [45 + 10 * k for k in range(runs)]
    gc.collect()
    assert all(ref() is None for ref in loops)
