"""bench/lora.py reads a run directory's records into its table (no run started here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_run(run_dir: Path, rows: list[dict[str, float]], info: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "time": 0, "metrics": r}) for i, r in enumerate(rows)]
    lines.append(json.dumps({"step": 1, "time": 1, "metrics": {**rows[0], "reward/mean": 0.0}}))  # rewritten
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"info": info}))


def test_read_run_and_table(bench_script, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bench = bench_script("lora")
    rows = [
        {
            "timing_step_total": 1.0 + i,
            "memory/peak_rss_gb": 0.5 + i / 10,
            "weight_sync/bytes": 1000.0,
            "weight_sync/seconds": 0.01 * (i + 1),
            "reward/mean": i / 10,
        }
        for i in range(12)
    ]
    write_run(tmp_path / "full", rows, {"trainable_parameters": 100})
    lora_rows = [{**r, "weight_sync/bytes": 95.0} for r in rows]
    write_run(tmp_path / "lora", lora_rows, {"trainable_parameters": 9})
    full = bench.read_run("full", tmp_path / "full", 10.0)
    assert full.step_s == 6.5 and full.memory_gb == 0.5 + 11 / 10 and full.sync_s == 0.065
    # step 1's later record (reward 0) replaces the first: first five = (0 + .1 + .2 + .3 + .4) / 5
    assert abs(full.reward_first - 0.2) < 1e-12 and abs(full.reward_last - 0.9) < 1e-12
    bench.print_table([full, bench.read_run("lora", tmp_path / "lora", 9.0)])
    out = capsys.readouterr().out
    assert "| lora | 9 |" in out and "9.5% of the full model's bytes" in out
