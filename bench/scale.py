"""How the driver's cost grows with the cluster: the real orchestrator against simulated servers.

Run: ``.venv/bin/python bench/scale.py`` (the sweep and a long run), or pick parts:
``--servers 1,16,64 --concurrency 32,256 --steps 20`` for the sweep, ``--long-steps 10000`` for
the memory run (0 skips it), ``--profile 64`` for the per-phase CPU breakdown at 64 servers.
``--routing`` prints only the routing table instead: each routing policy (``rollouts/routing.py``)
against simulated servers with a prefix cache and a cost per prefilled token, on multi-turn
workloads with skewed lengths (``bench/routing.py``: hit rate, throughput, per-server load).

What is real: the prompt scheduler and prefetch, the rollout runner (tokens, logprobs, stop
handling), the ``reverse_text`` environment's reward, groups, staleness, the batch builder and
packer, the run hooks through a plugin manager, and the ``local`` logger writing a run
directory (metrics, events, rollouts). What is simulated (named as such): each server is a
``SimulatedServer`` that answers a completion at once with synthetic token ids and logprobs
(no model; drawn from 4,096 random completions made before the run, so the simulator's own
cost is not the driver's), and the trainer is a ``StubTrainer`` whose step and weight sync return at once. So
every figure is the driver's own cost: samples/s through one driver, its CPU per sample, and
how both change as servers go 1 -> 256 and the concurrency per server 32 -> 256.

The long run records the driver's RSS and the run directory's size every ``--long-steps / 10``
steps: memory must stay flat (steady state from 10% of the run on) and bytes per sample say
what a long run leaves on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import pstats
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telescope.core.algorithms import get_algorithm
from telescope.core.cluster.gc_tuning import driver_gc
from telescope.core.env.chat import ChatOptions
from telescope.core.inference.client import Completion
from telescope.core.observe import LoggerHub
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.plugins import build_registry, get_plugin_manager
from telescope.core.rollouts.batching import BatchBuilder
from telescope.core.rollouts.prompts import PromptSource
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv
from telescope.core.rollouts.tokens import stop_token_ids
from telescope.core.runtime.assemble import load_environments
from telescope.core.runtime.orchestrator import Orchestrator
from telescope.core.testing import make_config

GROUP_SIZE = 8
COMPLETION_TOKENS = 24


SYNTHETIC_COMPLETIONS = 4096
"""Distinct synthetic completions the simulated servers draw from (made before the run)."""


def synthetic_completions(vocab: list[int], count: int = SYNTHETIC_COMPLETIONS) -> list[list[int]]:
    """``count`` random completions of ``COMPLETION_TOKENS`` ids: drawn, not generated, during a
    run, so the simulator's own cost (a random draw per token) is not counted as the driver's."""
    rng = random.Random(1234)
    return [rng.choices(vocab, k=COMPLETION_TOKENS) for _ in range(count)]


@dataclass
class SimulatedServer:
    """A simulated inference server: answers at once with synthetic tokens and logprobs (no model)."""

    completions: list[list[int]]
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    requests: int = 0

    async def complete(self, prompt: list[int], **params: Any) -> list[Completion]:
        self.requests += 1
        await asyncio.sleep(0)  # a real client yields to the loop while the request is out
        ids = list(self.completions[self.rng.randrange(len(self.completions))])  # the caller's own list
        return [Completion(0, ids, [-0.5] * len(ids), "stop", "", list(prompt), None)]

    async def abort(self, request_ids: list[str] | None = None) -> int:
        return len(request_ids or [])


@dataclass
class StubTrainer:
    """A stub trainer: its step and weight sync return at once (the driver's cost only)."""

    dp_world_size: int = 1
    steps: int = 0

    async def train_step(self, step: int, batch: Any) -> dict[str, float]:
        self.steps += 1
        return {"loss": 0.0}

    async def sync_weights(self, version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        return {"timing_weight_sync_total": 0.0}


@dataclass
class Rig:
    """One driver wired as a run wires it, with simulated servers and a stub trainer."""

    orchestrator: Orchestrator
    hub: LoggerHub
    servers: list[SimulatedServer]
    run_dir: Path


def build(tokenizer: Any, run_dir: Path, servers: int, per_server: int, steps: int) -> Rig:
    """A driver for ``servers`` simulated servers with ``per_server`` requests in flight on each.

    A step trains on as many groups as the servers run at once, so every step keeps every
    server full: ``servers * per_server / GROUP_SIZE`` groups of ``GROUP_SIZE``.
    """
    groups_per_step = max(1, servers * per_server // GROUP_SIZE)
    cfg = make_config(
        model="telescope/tiny",
        environments=[{"name": "reverse_text"}],
        group_size=GROUP_SIZE,
        prompts_batch_size_for_trainer=groups_per_step,
        number_of_steps=steps,
        max_async_rollout=1,
        max_tokens=COMPLETION_TOKENS,
        seq_len=4096,
        max_concurrent_prompts_per_server=max(1, per_server // GROUP_SIZE),
        enable_prompt_prefetch=True,
        prompt_prefetch_buffer_size=max(4, groups_per_step),
        discard_group_zero_advantage=False,
        inference_num_workers=servers,
        run_dir=str(run_dir),
    )
    pset = get_plugin_manager(load_entrypoints=True)
    registry = build_registry(pset)
    envs = load_environments(cfg, registry)
    sources = [SourceEnv(name, 1.0, len(env)) for name, env in envs.items()]
    ranges = {name: (env.reward_min, env.reward_max) for name, env in envs.items()}
    prompts = PromptSource(
        PromptScheduler(sources, cfg.seed),
        envs,
        ranges,
        tokenizer,
        ChatOptions(),
        cfg.prompt_prefetch_buffer_size,
    )
    runner = RolloutRunner(tokenizer, GenerationSettings.from_config(cfg, stop_token_ids(tokenizer)), None)
    batches = BatchBuilder(cfg, get_algorithm(cfg.algorithm, registry), tokenizer.pad_token_id or 0)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, str(run_dir), system_metrics=False, ticker=False)
    pset.pm.register(hub, name="core.logger_hub")
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(min(len(tokenizer), 4000)) if i not in special]
    completions = synthetic_completions(vocab)
    sims = [SimulatedServer(completions, random.Random(i)) for i in range(servers)]
    orchestrator = Orchestrator(cfg, prompts, runner, sims, StubTrainer(), batches, pset.pm.hook)  # type: ignore[arg-type]
    return Rig(orchestrator, hub, sims, run_dir)


def rss_mb() -> float:
    """This process's resident memory now (MB), from /proc (ru_maxrss would be the peak)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"


@dataclass
class Figures:
    samples: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.samples * 1e6


def run(rig: Rig, on_step: Callable[[int], None] | None = None, tuned_gc: bool = True) -> Figures:
    """Run the driver to its last step; wall and CPU time of the whole run (``tuned_gc``: with
    the driver's collector settings, ``cluster.gc_tuning``, else CPython's defaults)."""
    if on_step is not None:
        rig.orchestrator.hooks.append(_StepProbe(on_step))
    # the driver enters driver_gc once per run (its first full collection is start-up, not per-sample cost)
    with driver_gc() if tuned_gc else contextlib.nullcontext():
        cpu0, t0 = time.process_time(), time.perf_counter()
        counts = asyncio.run(rig.orchestrator.run())
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rig.hub.finish()
    samples = sum(s.requests for s in rig.servers)
    assert counts.completed_steps == rig.orchestrator.cfg.number_of_steps, counts
    return Figures(samples, wall, cpu)


@dataclass
class _StepProbe:
    """An after-step hook of the orchestrator that calls ``on_step(step)``."""

    on_step: Callable[[int], None]

    async def after_step(self, orchestrator: Any, step: int) -> None:
        self.on_step(step)


PHASES = {
    "prompts (scheduler, chat template, tokenize)": (
        "rollouts/prompts",
        "rollouts/scheduler",
        "env/chat",
        "tokenization",
    ),
    "rollouts (requests, tokens, stop handling)": (
        "rollouts/rollout",
        "rollouts/tokens",
        "rollouts/inflight",
        "rollouts/lanes",
    ),
    "rewards (reverse_text)": ("telescope/envs", "env/base", "env/rubric"),
    "groups, staleness, batching, packing": (
        "rollouts/groups",
        "rollouts/batching",
        "core/packing",
        "algorithms",
    ),
    "hooks and run directory (local logger)": ("observe/", "pluggy"),
    "orchestrator and step metrics": ("runtime/", "rollouts/reporting", "step_metrics"),
    "asyncio event loop": ("asyncio/",),
}


def phase_breakdown(stats: pstats.Stats, samples: int) -> list[tuple[str, float]]:
    """Self time per phase (µs per sample), by the file each function lives in."""
    totals: dict[str, float] = dict.fromkeys([*PHASES, "other (tokenizer, json, stdlib)"], 0.0)
    for (filename, _, _), (_, _, self_time, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        path = filename.replace("\\", "/")
        phase = next((name for name, keys in PHASES.items() if any(k in path for k in keys)), None)
        totals[phase or "other (tokenizer, json, stdlib)"] += self_time
    return [(name, seconds / samples * 1e6) for name, seconds in totals.items()]


def sweep(tokenizer: Any, servers: list[int], concurrency: list[int], steps: int) -> None:
    print(
        f"\n## Sweep: {steps} steps each, groups of {GROUP_SIZE}, {COMPLETION_TOKENS} tokens per completion"
    )
    print(
        f"{'servers':>7} {'per server':>10} {'gc':>8} {'samples':>8} {'samples/s':>10} "
        f"{'CPU µs/sample':>14}  machine"
    )
    for n in servers:
        for c in concurrency:
            for tuned in (False, True):  # CPython's collector defaults, then the driver's (gc_tuning)
                with tempfile.TemporaryDirectory() as tmp:
                    gc.collect()
                    figures = run(build(tokenizer, Path(tmp), n, c, steps), tuned_gc=tuned)
                print(
                    f"{n:>7} {c:>10} {'driver' if tuned else 'default':>8} {figures.samples:>8} "
                    f"{figures.per_s:>10.0f} {figures.cpu_us:>14.0f}  {load_average()}"
                )


def profile(tokenizer: Any, servers: int, per_server: int, steps: int) -> None:
    print(f"\n## Driver CPU per sample by phase: {servers} servers x {per_server}, {steps} steps (cProfile)")
    with tempfile.TemporaryDirectory() as tmp:
        rig = build(tokenizer, Path(tmp), servers, per_server, steps)
        profiler = cProfile.Profile()
        profiler.enable()
        figures = run(rig)
        profiler.disable()
    rows = phase_breakdown(pstats.Stats(profiler), figures.samples)
    total = sum(us for _, us in rows)
    for name, us in sorted(rows, key=lambda r: -r[1]):
        print(f"  {name:<44} {us:>8.1f} µs/sample  {us / total:>5.0%}")
    print(f"  {'(profiled total; unprofiled ' + f'{figures.cpu_us / 1:.0f} µs wall-CPU incl. profiler)':<44}")


def long_run(tokenizer: Any, steps: int, servers: int, per_server: int) -> None:
    every = max(1, steps // 10)
    print(f"\n## Long run: {steps} steps, {servers} servers x {per_server} ({load_average()})")
    print(f"{'step':>6} {'RSS MB':>8} {'run dir MB':>10} {'bytes/sample':>12} {'samples/s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        rig = build(tokenizer, Path(tmp), servers, per_server, steps)
        marks: list[tuple[int, float, int, int, float]] = []
        t0 = time.perf_counter()

        def on_step(step: int) -> None:
            if step % every == 0:
                gc.collect()
                samples = sum(s.requests for s in rig.servers)
                marks.append((step, rss_mb(), dir_bytes(rig.run_dir), samples, time.perf_counter() - t0))
                s, rss, size, n, t = marks[-1]
                print(f"{s:>6} {rss:>8.1f} {size / 1e6:>10.1f} {size / max(n, 1):>12.0f} {n / t:>10.0f}")
                sys.stdout.flush()

        run(rig, on_step)
        steady = [m for m in marks if m[0] >= every]
        if len(steady) >= 2:
            first, last = steady[0][1], steady[-1][1]
            print(
                f"RSS from step {steady[0][0]} to {steady[-1][0]}: {first:.1f} -> {last:.1f} MB ({last / first - 1:+.1%})"
            )
        size = dir_bytes(rig.run_dir)
        samples = sum(s.requests for s in rig.servers)
        print(
            f"run directory: {size / 1e6:.1f} MB, {size / samples:.0f} bytes per sample, {size / steps:.0f} per step"
        )
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")


def routing_bench() -> Any:
    """bench/routing.py as a module (the routing policies against simulated prefix-cache servers)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_routing", Path(__file__).with_name("routing.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1,4,16,64,256", help="comma-separated server counts")
    parser.add_argument("--concurrency", default="32,256", help="requests in flight per server")
    parser.add_argument("--steps", type=int, default=10, help="steps per sweep point")
    parser.add_argument("--profile", type=int, default=64, help="servers for the phase breakdown (0: skip)")
    parser.add_argument("--long-steps", type=int, default=10_000, help="steps of the memory run (0: skip)")
    parser.add_argument("--long-servers", type=int, default=4)
    parser.add_argument("--long-concurrency", type=int, default=16)
    parser.add_argument(
        "--routing", action="store_true", help="only the routing policies' table (bench/routing.py)"
    )
    args = parser.parse_args()
    if args.routing:
        routing_bench().table()
        return
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny"))
    print(f"bench/scale.py on {os.cpu_count()} CPUs, python {sys.version.split()[0]} ({load_average()})")
    servers = [int(x) for x in args.servers.split(",") if x]
    concurrency = [int(x) for x in args.concurrency.split(",") if x]
    if servers and concurrency and args.steps:
        sweep(tokenizer, servers, concurrency, args.steps)
    if args.profile:
        profile(tokenizer, args.profile, concurrency[0] if concurrency else 32, args.steps)
    if args.long_steps:
        long_run(tokenizer, args.long_steps, args.long_servers, args.long_concurrency)


if __name__ == "__main__":
    main()
