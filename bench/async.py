"""Async overlap: the same workload with max_async_rollout 0 and 2, side by side.

The transformers engine sleeps ``--decode-delay`` seconds per decode step, simulating a
GPU-bound generator whose time does not compete with the trainer for CPU (on a 2-core
machine real CPU decoding would). From the synchronous run we read the generation time
(the trainer's wait for data) and the training time per step; the ideal async speed-up is
(gen + train) / max(gen, train). Prints steps/s of both runs and the fraction of the ideal
overlap achieved.

    .venv/bin/python bench/async.py [--steps 14] [--decode-delay 0.04]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

from telescope.core.config import load_config
from telescope.core.plugins import load_plugins
from telescope.core.runtime import run_training


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(max_async: int, steps: int, delay: float, root: Path) -> list[dict[str, float]]:
    pset, registry = load_plugins()
    run_dir = root / f"async{max_async}"
    cfg = load_config(
        None,
        {
            "model": "telescope/tiny",
            "mixed_precision_dtype": None,
            "environments": [{"name": "reverse_text"}],
            "inference_engine": "transformers",
            "inference_num_workers": 1,
            "trainer_num_workers": 2,
            "inference_engine_kwargs": {"simulated_decode_step_s": delay, "num_threads": 1},
            "ray_inference_cpus_per_worker": 0.5,
            "ray_trainer_cpus_per_worker": 0.5,
            "ray_address": "local",
            "inference_base_port": free_port(),
            "group_size": 8,
            "prompts_batch_size_for_trainer": 8,
            "number_of_steps": steps,
            "max_async_rollout": max_async,
            "max_tokens": 24,
            "seq_len": 1024,
            "pad_to_multiple_of": 8,
            "learning_rate": 1e-4,
            "discard_group_zero_advantage": False,
            "use_wandb": False,
            "run_dir": str(run_dir),
        },
        registry,
    )
    run_training(cfg, pset, registry)
    rows = [json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    parser.add_argument("--decode-delay", type=float, default=0.04, help="seconds per decode step")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="telescope-bench-async-"))
    results = {}
    for max_async in (0, 2):
        start = time.time()
        rows = run(max_async, args.steps, args.decode_delay, root)[args.warmup :]
        step_times = [r["timing_step_total"] for r in rows]
        results[max_async] = {
            "steps_per_s": len(step_times) / sum(step_times),
            "wait": statistics.mean(r["timing_waiting_for_data"] for r in rows),
            "step": statistics.mean(step_times),
            "wall": time.time() - start,
        }
    sync = results[0]
    gen, train = sync["wait"], sync["step"] - sync["wait"]
    ideal = (gen + train) / max(gen, train)
    speedup = results[2]["steps_per_s"] / sync["steps_per_s"]
    print(
        f"decode delay {args.decode_delay * 1000:.0f} ms/step, {args.steps - args.warmup} timed steps per run"
    )
    print(
        f"sync  (max_async_rollout 0): {sync['steps_per_s']:.3f} steps/s  (gen {gen:.2f} s + train {train:.2f} s per step)"
    )
    print(f"async (max_async_rollout 2): {results[2]['steps_per_s']:.3f} steps/s")
    print(
        f"speed-up {speedup:.2f}x, ideal {ideal:.2f}x -> {100 * (speedup - 1) / max(ideal - 1, 1e-9):.0f}% of the ideal gain, "
        f"{100 * speedup / ideal:.0f}% of the ideal speed (target >= 90%)"
    )


if __name__ == "__main__":
    main()
