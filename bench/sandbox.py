"""Benchmark the ``local`` sandbox provider.

Prints create+execute+destroy latency (median, p95) and throughput with 1, 4 and 16
concurrent sandboxes, and the overhead of ``execute`` over running the same command
unsandboxed (median; target <= 30 ms). Run: ``python bench/sandbox.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from telescope.core.sandbox import SandboxConfig
from telescope.sandboxes.local import LocalSandboxProvider

COMMAND = "python3 -c 'print(sum(range(1000)))'"
#: The sandbox's environment, so both runs use the same (system) python3.
PLAIN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def lifecycle(provider: LocalSandboxProvider, config: SandboxConfig) -> float:
    started = time.perf_counter()
    handle = await provider.create(config)
    try:
        result = await provider.execute(handle, COMMAND, timeout=30)
        assert result.stdout.strip() == "499500", result
    finally:
        await provider.destroy(handle)
    return time.perf_counter() - started


async def concurrent_lifecycles(provider: LocalSandboxProvider, concurrency: int, total: int) -> None:
    config = SandboxConfig()
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            latencies.append(await lifecycle(provider, config))

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    wall = time.perf_counter() - started
    print(
        f"concurrency {concurrency:>2}: create+execute+destroy median {statistics.median(latencies) * 1e3:7.1f} ms, "
        f"p95 {p95(latencies) * 1e3:7.1f} ms, throughput {total / wall:6.1f} sandboxes/s ({total} runs)"
    )


async def unsandboxed(command: str) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=PLAIN_ENV,
    )
    await proc.communicate()
    return time.perf_counter() - started


async def execute_overhead(provider: LocalSandboxProvider, rounds: int) -> None:
    for command in ("true", COMMAND):
        sandboxed, plain = [], []
        async with provider.sandbox(SandboxConfig()) as handle:
            for _ in range(rounds):  # interleaved, so machine noise hits both alike
                started = time.perf_counter()
                await provider.execute(handle, command, timeout=30)
                sandboxed.append(time.perf_counter() - started)
                plain.append(await unsandboxed(command))
        overhead = (statistics.median(sandboxed) - statistics.median(plain)) * 1e3
        print(
            f"execute {command!r}: sandboxed median {statistics.median(sandboxed) * 1e3:.1f} ms, "
            f"unsandboxed {statistics.median(plain) * 1e3:.1f} ms, overhead {overhead:.1f} ms (target <= 30 ms)"
        )


async def main(rounds: int) -> None:
    provider = LocalSandboxProvider()
    print(f"local provider, bubblewrap: {provider.bwrap}")
    await execute_overhead(provider, rounds)
    for concurrency in (1, 4, 16):
        await concurrent_lifecycles(provider, concurrency, total=max(rounds, 2 * concurrency))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="executions per measurement")
    asyncio.run(main(parser.parse_args().rounds))
