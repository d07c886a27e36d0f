"""bench/routing.py: the routing policies against simulated servers with a prefix cache."""

from __future__ import annotations

from typing import Any

from telescope.core.rollouts.routing import RouteKey


def test_the_simulated_cache_finds_a_conversation_then_its_group_and_evicts_the_oldest(
    bench_script: Any,
) -> None:
    bench = bench_script("routing")
    server = bench.CachedServer(workers=1, cache_tokens=1000)
    request = bench.Request(RouteKey("g0-s0", "g0", 0), 0, 700, 10, 300, None)
    assert server.lookup(request) == 0
    server.store("g0", 300, in_flight=0)
    assert server.lookup(request) == 300  # the group's prompt
    server.store("g0-s0", 600, in_flight=0)
    assert server.lookup(request) == 600  # the rollout's own conversation, a longer prefix
    server.store("g1", 200, in_flight=0)  # 300 + 600 + 200 > 1000: the least recently used goes
    assert list(server.cache) == ["g0-s0", "g1"] and server.cached == 800
    server.store("g2", 100, in_flight=500)  # running requests leave 500: 900 cached, the oldest goes
    assert list(server.cache) == ["g1", "g2"] and server.cached == 300


def test_sticky_routing_hits_the_cache_where_least_loaded_scatters_conversations(bench_script: Any) -> None:
    bench = bench_script("routing")
    workload = bench.Workload(
        "small", 12, 4, lambda r: r.randint(3, 6), lambda r: 400, lambda r: 40, lambda r: r.randint(20, 60)
    )
    cluster = bench.Cluster(servers=3, slots=4, workers=4, cache_tokens=50_000)
    results = {
        p: bench.simulate(workload, p, cluster, seed=1)
        for p in ("pinned", "least_loaded", "sticky_least_loaded")
    }
    for result in results.values():
        assert abs(sum(result.shares) - 1.0) < 1e-9 and result.tokens_per_s > 0
    # nothing is evicted (ample cache): every turn after a rollout's first finds its conversation
    # when it returns to the same server, so only the first turns (group prompt) can miss
    assert results["pinned"].hit_rate > 0.75 and results["pinned"].moves == 0
    assert results["sticky_least_loaded"].hit_rate > results["least_loaded"].hit_rate + 0.1


def test_the_comparison_pairs_seeds_against_the_best_single_policy(bench_script: Any) -> None:
    bench = bench_script("routing")

    def runs(*figures: tuple[float, float]) -> list[Any]:
        return [bench.Result(hit, tps, [1.0], 0) for hit, tps in figures]

    line = bench.against_best_single(
        {
            "pinned": runs((0.50, 100.0), (0.60, 300.0)),  # best hit rate (mean 0.55)
            "sticky": runs((0.40, 400.0), (0.50, 400.0)),  # best throughput (mean 400)
            "least_loaded": runs((0.10, 50.0), (0.10, 50.0)),
            "sticky_least_loaded": runs((0.52, 410.0), (0.61, 380.0)),
        }
    )
    # hit: differences +2 and +1 points: mean +1.5, s.e. = stdev(2, 1) / sqrt(2) = 0.5
    # throughput: +10 and -20 vs sticky: mean -5, s.e. = stdev(10, -20) / sqrt(2) = 15
    assert "hit rate +1.50 points (s.e. 0.50) vs today (pinned)" in line
    assert "throughput -5.00 tokens/s (s.e. 15.00) vs sticky only" in line
