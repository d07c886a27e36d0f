"""bench/gateway.py runs end to end on a few calls and reports every path at every concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType


def test_bench_gateway_reports_each_path(bench_script: Callable[[str], ModuleType], tiny_path: str) -> None:
    bench = bench_script("gateway")
    rows = asyncio.run(bench.run(calls=5, levels=[1, 2], tokens=4))
    assert [(r["path"], r["concurrency"]) for r in rows] == [
        (path, level) for level in (1, 2) for path in ("direct", "gateway completions", "gateway chat")
    ]
    assert all(r["calls_per_s"] > 0 and r["p90_ms"] >= r["median_ms"] > 0 for r in rows)
    table = bench.report(rows)
    assert "overhead ms" in table and len(table.splitlines()) == 7
