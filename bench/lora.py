"""Full fine-tuning vs LoRA, side by side on one workload: the CPU quickstart.

Runs `telescope train examples/quickstart.yaml` (full) and `examples/quickstart_lora.yaml` (LoRA),
one after the other with the same seed and number of steps, then reads each run directory and
prints one row per mode: trainable parameters, median step time, trainer peak memory (peak RSS
of a trainer rank on CPU, peak allocated on CUDA), median bytes and seconds of one weight sync
(`weight_sync/bytes`, `weight_sync/seconds`), and the mean reward of the first and last 5 steps.

    .venv/bin/python bench/lora.py [--steps 100] [--seed 0] [--keep DIR] [-- --lora_rank 4 ...]

Everything after `--` is passed to the LoRA run only (variants of the adapter settings).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 5
CONFIGS = {"full": ROOT / "examples" / "quickstart.yaml", "lora": ROOT / "examples" / "quickstart_lora.yaml"}


class ModeResult(NamedTuple):
    """One run of the workload, read back from its run directory."""

    mode: str
    trainable: int | None
    step_s: float
    memory_gb: float
    sync_bytes: float
    sync_s: float
    reward_first: float
    reward_last: float
    wall_s: float


def read_run(mode: str, run_dir: Path, wall_s: float) -> ModeResult:
    """The figures of one finished run (the later record of a step wins)."""
    by_step = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step[record["step"]] = record["metrics"]
    rows = [by_step[s] for s in sorted(by_step)]
    info = json.loads((run_dir / "run.json").read_text()).get("info", {})
    memory = [r.get("memory/peak_rss_gb", r.get("memory/peak_allocated_gb", 0.0)) for r in rows]
    rewards = [r["reward/mean"] for r in rows]
    return ModeResult(
        mode=mode,
        trainable=info.get("trainable_parameters"),
        step_s=statistics.median(r["timing_step_total"] for r in rows),
        memory_gb=max(memory),
        sync_bytes=statistics.median(r["weight_sync/bytes"] for r in rows),
        sync_s=statistics.median(r["weight_sync/seconds"] for r in rows),
        reward_first=statistics.fmean(rewards[:WINDOW]),
        reward_last=statistics.fmean(rewards[-WINDOW:]),
        wall_s=wall_s,
    )


def run_mode(mode: str, steps: int, seed: int, extra: list[str], root: Path) -> ModeResult:
    run_dir = root / mode
    telescope = Path(sys.executable).with_name("telescope")
    cmd = [
        str(telescope),
        "train",
        str(CONFIGS[mode]),
        "--run_dir",
        str(run_dir),
        "--seed",
        str(seed),
        "--number_of_steps",
        str(steps),
        "--overwrite",
        "true",
        *extra,
    ]
    start = time.time()
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f"{mode} run failed with exit code {proc.returncode}")
    return read_run(mode, run_dir, time.time() - start)


def print_table(results: list[ModeResult]) -> None:
    print(
        "| mode | trainable params | step (median) | trainer peak memory | sync bytes | sync time | "
        f"reward first {WINDOW} -> last {WINDOW} | wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.mode} | {r.trainable if r.trainable is not None else '?':,} | {r.step_s:.2f} s | "
            f"{r.memory_gb:.2f} GB | {r.sync_bytes / 1e3:,.0f} KB | {r.sync_s * 1e3:.0f} ms | "
            f"{r.reward_first:.3f} -> {r.reward_last:.3f} ({r.reward_last - r.reward_first:+.3f}) | "
            f"{r.wall_s:.0f} s |"
        )
    full, lora = results
    print(f"LoRA sync moves {lora.sync_bytes / full.sync_bytes:.1%} of the full model's bytes per step")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="telescope-bench-lora-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"{args.steps} steps, seed {args.seed}, load {os.getloadavg()[0]:.1f}, runs in {root}", flush=True)
    results = [
        run_mode("full", args.steps, args.seed, [], root),
        run_mode("lora", args.steps, args.seed, extra, root),
    ]
    print_table(results)


if __name__ == "__main__":
    main()
