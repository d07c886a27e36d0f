"""bench/scale.py drives the real orchestrator against simulated servers and a stub trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_every_sample_is_served_trained_and_recorded(
    bench_script: Any, tokenizer: Any, tmp_path: Path
) -> None:
    bench = bench_script("scale")
    rig = bench.build(tokenizer, tmp_path, servers=3, per_server=16, steps=4)
    seen: list[int] = []
    figures = bench.run(rig, seen.append)
    # every step trains servers x per-server samples: 3 x 16 = 48 = 6 groups of 8
    assert seen == [1, 2, 3, 4] and rig.orchestrator.trainer.steps == 4
    trained = 4 * 3 * 16
    assert trained <= figures.samples <= trained + 3 * 16 * 2  # what max_async_rollout=1 keeps in flight
    assert all(server.requests > 0 for server in rig.servers)  # the load is spread over every server
    rows = bench.dir_bytes(tmp_path)
    assert rows > 0 and (tmp_path / "metrics.jsonl").is_file()


def test_phase_breakdown_files_functions_by_module(bench_script: Any) -> None:
    bench = bench_script("scale")

    class Stats:
        stats = {
            ("/x/telescope/core/rollouts/batching.py", 1, "f"): (1, 1, 0.002, 0.002, {}),
            ("/x/telescope/core/observe/loggers/local.py", 1, "g"): (1, 1, 0.001, 0.001, {}),
            ("/usr/lib/python3.11/json/encoder.py", 1, "h"): (1, 1, 0.003, 0.003, {}),
        }

    rows = dict(bench.phase_breakdown(Stats(), samples=1000))
    assert rows["groups, staleness, batching, packing"] == 2.0  # 2 ms over 1000 samples
    assert rows["hooks and run directory (local logger)"] == 1.0
    assert rows["other (tokenizer, json, stdlib)"] == 3.0
