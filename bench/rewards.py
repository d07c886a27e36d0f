"""Reward throughput (samples/s) of countdown, math, wordle and reverse_text scoring.

Run: ``.venv/bin/python bench/rewards.py [--samples N] [--concurrency C]``.

Each environment scores N completions (a mix of correct, wrong, malformed and hostile ones)
through ``Environment.score`` -- the path the orchestrator uses, with the Rubric's thread
pool, timeouts and error capture. "sequential" awaits one score at a time (latency bound);
"concurrent" keeps C scores in flight with ``asyncio.gather`` (what a run does). Math runs
math-verify in worker processes; its pool start-up is timed separately. Figures are wall
clock on this machine; compare them only on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from telescope.core.env import Sample, TrajectoryStep
from telescope.core.env.math_check import shared_verifier
from telescope.core.plugins import load_plugins


def countdown_cases(n: int) -> list[tuple[Any, Sample]]:
    sample = Sample("q", "22", {"nums": [3, 5, 7], "target": 22})
    texts = [
        "<think>3*5=15</think><answer>3 * 5 + 7</answer>",
        "<think>x</think><answer>3 + 5 + 7</answer>",
        "<answer>__import__('os')</answer>",
        "<think>" + "a" * 10_000 + "</think><answer>1</answer>",
    ]
    return [(texts[i % len(texts)], sample) for i in range(n)]


def math_cases(n: int) -> list[tuple[Any, Sample]]:
    pairs = [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{6}", "6"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("no box", "3"),
        ("\\boxed{x^2+2x+1}", "(x+1)^2"),
        ("\\boxed{7}", "8"),
    ]
    return [(pairs[i % len(pairs)][0], Sample("q", pairs[i % len(pairs)][1])) for i in range(n)]


def wordle_cases(env: Any, n: int) -> list[tuple[Any, Sample]]:
    out = []
    for i in range(n):
        sample = Sample("play", "crane")
        state = env.create_initial_state(sample)
        guesses = ["slate", "plane", "crane"][: 1 + i % 3]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "play"}]
        for g in guesses:
            reply = {"role": "assistant", "content": f"<think>hm</think><guess>[{g}]</guess>"}
            state.trajectory.append(TrajectoryStep(list(messages), [reply]))
            messages += [reply, {"role": "user", "content": "S L A T E\nX X G X G\nYou have 5 guesses left."}]
        out.append((state, sample))
    return out


def reverse_cases(n: int) -> list[tuple[Any, Sample]]:
    sample = Sample("hello world", "dlrow olleh")
    texts = ["dlrow olleh", "dlrow", "hello world " * 200, ""]
    return [(texts[i % len(texts)], sample) for i in range(n)]


async def _sequential(env: Any, cases: list[tuple[Any, Sample]]) -> float:
    start = time.perf_counter()
    for target, sample in cases:
        await env.score(target, sample)
    return len(cases) / (time.perf_counter() - start)


async def _concurrent(env: Any, cases: list[tuple[Any, Sample]], concurrency: int) -> tuple[float, int]:
    sem = asyncio.Semaphore(concurrency)

    async def one(target: Any, sample: Sample) -> float:
        async with sem:
            result = await env.score(target, sample)
            return result.sample_metrics.get("reward_error", 0) + result.sample_metrics.get(
                "reward_timeout", 0
            )

    start = time.perf_counter()
    failures = await asyncio.gather(*(one(t, s) for t, s in cases))
    return len(cases) / (time.perf_counter() - start), int(sum(failures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=600, help="completions scored per environment")
    parser.add_argument("--concurrency", type=int, default=64, help="scores in flight in the concurrent run")
    args = parser.parse_args()
    _, registry = load_plugins()
    start = time.perf_counter()
    shared_verifier().warmup()
    print(f"math-verify worker pool start-up: {time.perf_counter() - start:.2f} s")
    wordle = registry.create("environment", "wordle", {})
    setups: list[tuple[str, Any, list[tuple[Any, Sample]]]] = [
        ("countdown", registry.create("environment", "countdown", {}), countdown_cases(args.samples)),
        ("hendrycks_math", registry.create("environment", "hendrycks_math", {}), math_cases(args.samples)),
        ("wordle", wordle, wordle_cases(wordle, args.samples)),
        ("reverse_text", registry.create("environment", "reverse_text", {}), reverse_cases(args.samples)),
    ]
    print(
        f"{'environment':<16}{'sequential/s':>14}{'concurrent/s':>14}{'failures':>10}   (N={args.samples}, C={args.concurrency})"
    )
    for name, env, cases in setups:
        seq = asyncio.run(_sequential(env, cases))
        conc, failures = asyncio.run(_concurrent(env, cases, args.concurrency))
        print(f"{name:<16}{seq:>14.0f}{conc:>14.0f}{failures:>10}")
    shared_verifier().close()


if __name__ == "__main__":
    main()
