"""Routing policies against simulated servers with a prefix cache (``bench/scale.py --routing``).

What is real: the lanes (``rollouts/lanes.py``: a group goes to the server with the most free
slots, each sample holds a slot for its whole rollout) and the router (``rollouts/routing.py``,
each policy exactly as a run uses it). What is simulated (named as such): each server is a
``CachedServer`` running ``workers`` requests at once (more wait in its queue), with an LRU prefix
cache of ``cache_tokens`` tokens (a rollout's conversation after each turn, a group's prompt), and
a request costs ``prefill_s`` per prompt token not found in the cache plus ``decode_s`` per
generated token; between turns the environment takes ``env_s``. The router is told each request's
prompt length and the simulated cache size (``sticky_least_loaded`` moves a turn off a saturated
server only once the conversations it holds overflow that cache). Time is simulated (an event
queue), so figures do not depend on this machine.

Printed per workload and policy: prefix-cache hit rate (prompt tokens found / prompt tokens),
throughput (generated tokens per simulated second) and each server's share of the requests; then
sticky + least loaded minus the best single policy, seed by seed, with its standard error.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from telescope.core.rollouts.lanes import Lanes, QueuedSample
from telescope.core.rollouts.routing import ROUTING_POLICIES, RouteKey, Router

Draw = Callable[[random.Random], int]


@dataclass(frozen=True)
class Workload:
    """Multi-turn rollouts with skewed lengths: ``groups`` x ``group_size`` rollouts."""

    name: str
    groups: int
    group_size: int
    turns: Draw
    prompt_tokens: Draw
    completion_tokens: Draw
    env_tokens: Draw


def skewed(short: tuple[int, int], long: tuple[int, int], long_share: float) -> Draw:
    """A draw from ``short`` most of the time and from ``long`` with probability ``long_share``."""
    return lambda rng: rng.randint(*(long if rng.random() < long_share else short))


WORKLOADS = [
    Workload(
        "agentic: 80% 2-4 turns, 20% 16-32",
        96,
        8,
        skewed((2, 4), (16, 32), 0.2),
        skewed((300, 800), (2000, 4000), 0.2),
        lambda r: r.randint(50, 200),
        skewed((50, 200), (400, 1200), 0.2),
    ),
    Workload(
        "long prompts: 2-6 turns, 30% 4-8k prompts",
        96,
        8,
        lambda r: r.randint(2, 6),
        skewed((500, 1500), (4000, 8000), 0.3),
        lambda r: r.randint(100, 300),
        lambda r: r.randint(100, 400),
    ),
    Workload(
        "GRPO x16: 3-5 turns, 10% 20-40",
        48,
        16,
        skewed((3, 5), (20, 40), 0.1),
        skewed((200, 600), (1500, 3000), 0.1),
        lambda r: r.randint(30, 120),
        lambda r: r.randint(50, 300),
    ),
]


@dataclass
class Request:
    key: RouteKey
    server: int
    prompt: int
    completion: int
    group_prompt: int
    rollout: Rollout


@dataclass
class Rollout:
    key: RouteKey
    slot: int
    turns_left: int
    context: int
    group_prompt: int


@dataclass
class CachedServer:
    """A simulated inference server: ``workers`` requests at once, an LRU prefix cache (simulated)."""

    workers: int
    cache_tokens: int
    running: int = 0
    queue: deque[Request] = field(default_factory=deque)
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)
    cached: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0

    def lookup(self, request: Request) -> int:
        """Prompt tokens found: the rollout's conversation so far, else its group's prompt."""
        for name in (request.key.rollout, request.key.group):
            if name in self.cache:
                self.cache.move_to_end(name)
                return min(self.cache[name], request.prompt)
        return 0

    def store(self, name: str, tokens: int, in_flight: int) -> None:
        """Keep ``name``'s prefix; evict the least recently used beyond what running requests leave."""
        self.cached += tokens - self.cache.pop(name, 0)
        self.cache[name] = tokens
        while self.cache and self.cached > max(0, self.cache_tokens - in_flight):
            _, evicted = self.cache.popitem(last=False)
            self.cached -= evicted


@dataclass(frozen=True)
class Cluster:
    servers: int = 8
    slots: int = 32
    """Rollouts per server (lanes)."""
    workers: int = 16
    cache_tokens: int = 120_000
    prefill_s: float = 0.0004
    decode_s: float = 0.02
    env_s: tuple[float, float] = (0.05, 1.0)


@dataclass
class Result:
    hit_rate: float
    tokens_per_s: float
    shares: list[float]
    moves: int


def simulate(workload: Workload, policy: str, cluster: Cluster, seed: int = 0, margin: int = 8) -> Result:
    """Run every rollout of ``workload`` to the end under ``policy``; figures over the whole run."""
    rng = random.Random(seed)
    lanes = Lanes(cluster.servers, cluster.slots)
    router = Router(cluster.servers, policy, margin, cache_tokens=cluster.cache_tokens)
    servers = [CachedServer(cluster.workers, cluster.cache_tokens) for _ in range(cluster.servers)]
    flight: list[list[int]] = [[] for _ in servers]  # tokens of the running requests, per server
    events: list[tuple[float, int, str, object]] = []
    order = iter(range(10**9))
    now, generated, next_group = 0.0, 0, 0
    prompts = {g: workload.prompt_tokens(rng) for g in range(workload.groups)}
    turns = {(g, i): workload.turns(rng) for g in range(workload.groups) for i in range(workload.group_size)}

    def push(at: float, kind: str, item: object) -> None:
        heapq.heappush(events, (at, next(order), kind, item))

    def begin(server: int, request: Request) -> None:
        box = servers[server]
        box.running += 1
        hit = box.lookup(request)
        box.requests += 1
        box.prompt_tokens += request.prompt
        box.hit_tokens += hit
        flight[server].append(request.prompt + request.completion)
        cost = (request.prompt - hit) * cluster.prefill_s + request.completion * cluster.decode_s
        push(now + cost, "done", request)

    def send(rollout: Rollout) -> None:
        server = router.route(rollout.key, rollout.context)
        router.running[server] += 1  # the router's in-flight count, as ``Router.request`` keeps it
        request = Request(
            rollout.key,
            server,
            rollout.context,
            workload.completion_tokens(rng),
            rollout.group_prompt,
            rollout,
        )
        box = servers[server]
        if box.running < box.workers:
            begin(server, request)
        else:
            box.queue.append(request)

    def admit() -> None:
        nonlocal next_group
        while next_group < workload.groups and (home := lanes.pick_server(1)) is not None:
            for index in range(workload.group_size):
                lanes.enqueue(home, QueuedSample(next_group, index))
            next_group += 1
        for ready in lanes.pop_ready():
            gid, index = ready.sample.group_id, ready.sample.index
            key = RouteKey(f"g{gid}-s{index}", f"g{gid}", ready.server)
            send(Rollout(key, ready.slot, turns[(gid, index)], prompts[gid], prompts[gid]))

    admit()
    while events:
        now, _, kind, item = heapq.heappop(events)
        if kind == "env":
            assert isinstance(item, Rollout)
            send(item)
            continue
        assert isinstance(item, Request)
        box, server = servers[item.server], item.server
        box.running -= 1
        router.running[server] -= 1
        flight[server].remove(item.prompt + item.completion)
        in_flight = sum(flight[server])
        box.store(item.key.rollout, item.prompt + item.completion, in_flight)
        box.store(item.key.group, item.group_prompt, in_flight)
        generated += item.completion
        if box.queue:
            begin(server, box.queue.popleft())
        rollout = item.rollout
        rollout.turns_left -= 1
        if rollout.turns_left > 0:
            rollout.context = item.prompt + item.completion + workload.env_tokens(rng)
            push(now + rng.uniform(*cluster.env_s), "env", rollout)
        else:
            router.release(rollout.key)
            lanes.release(rollout.key.home, rollout.slot)
            admit()
    prompt = sum(s.prompt_tokens for s in servers)
    total = sum(s.requests for s in servers)
    return Result(
        sum(s.hit_tokens for s in servers) / prompt,
        generated / now,
        [s.requests / total for s in servers],
        router.moves,
    )


NAMES = {
    "pinned": "today (pinned)",
    "sticky": "sticky only",
    "least_loaded": "least loaded only",
    "sticky_least_loaded": "sticky + least loaded",
}


def table(
    cluster: Cluster | None = None, seeds: tuple[int, ...] = tuple(range(20))
) -> list[tuple[str, str, Result]]:
    """Every workload under every policy (figures averaged over ``seeds``), printed as a table, then
    sticky + least loaded against the best single policy, seed by seed (the same workload draws)."""
    cluster = cluster or Cluster()
    print(
        f"routing: {cluster.servers} simulated servers x {cluster.slots} lanes, {cluster.workers} running at once, "
        f"prefix cache {cluster.cache_tokens:,} tokens, prefill {cluster.prefill_s * 1e3:g} ms/token, "
        f"decode {cluster.decode_s * 1e3:g} ms/token; mean of seeds {seeds[0]}-{seeds[-1]}"
    )
    rows = []
    for workload in WORKLOADS:
        print(f"\n{workload.name} ({workload.groups} groups x {workload.group_size})")
        print(f"  {'policy':<24}{'hit rate':>9}{'tokens/s':>10}{'moves':>7}  requests per server (%)")
        runs = {
            policy: [simulate(workload, policy, cluster, seed) for seed in seeds]
            for policy in ROUTING_POLICIES
        }
        for policy, results in runs.items():
            result = mean_result(results)
            shares = " ".join(f"{100 * s:4.1f}" for s in result.shares)
            print(
                f"  {NAMES[policy]:<24}{result.hit_rate:>9.1%}{result.tokens_per_s:>10.0f}{result.moves:>7}  {shares}"
            )
            rows.append((workload.name, policy, result))
        print(f"  {against_best_single(runs)}")
    return rows


def mean_result(runs: list[Result]) -> Result:
    """``runs`` averaged (moves: the mean rounded down)."""
    return Result(
        sum(r.hit_rate for r in runs) / len(runs),
        sum(r.tokens_per_s for r in runs) / len(runs),
        [sum(r.shares[i] for r in runs) / len(runs) for i in range(len(runs[0].shares))],
        sum(r.moves for r in runs) // len(runs),
    )


def against_best_single(runs: dict[str, list[Result]]) -> str:
    """Sticky + least loaded minus the single policy with the best mean, per metric: the mean of the
    per-seed differences and its standard error (a difference within ~2 s.e. is seed noise)."""
    ours, parts = runs["sticky_least_loaded"], []
    for metric, label, unit, scale in (
        ("hit_rate", "hit rate", "points", 100.0),
        ("tokens_per_s", "throughput", "tokens/s", 1.0),
    ):
        singles = [p for p in runs if p != "sticky_least_loaded"]
        best = max(singles, key=lambda p: statistics.fmean(getattr(r, metric) for r in runs[p]))
        diffs = [
            scale * (getattr(a, metric) - getattr(b, metric)) for a, b in zip(ours, runs[best], strict=True)
        ]
        error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        parts.append(f"{label} {statistics.fmean(diffs):+.2f} {unit} (s.e. {error:.2f}) vs {NAMES[best]}")
    return "sticky + least loaded minus the best single policy: " + "; ".join(parts)


if __name__ == "__main__":
    table()
