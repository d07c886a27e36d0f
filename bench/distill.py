"""On-policy distillation against GRPO alone, from the same start (examples/distill.yaml).

1. The teacher: the quickstart (examples/quickstart.yaml) trained to its plateau (~0.75 reward),
   checkpointed at its last step and converted to a Hugging Face folder (skipped with --teacher).
2. From the untrained quickstart model (~0.5), per seed: GRPO alone (the quickstart, no teacher),
   distillation alone (distill_reward_weight 0) and the mix (reward weight 1, kl coef 1).
3. One row per run: steps and wall time until the mean reward of the last 5 steps first reaches
   0.70 (``-`` if never), the final reward (mean of the last 5 steps), and the run's wall time;
   then each config's means.

    .venv/bin/python bench/distill.py [--seeds 0,1,2] [--steps 60] [--configs grpo,distill,mix]
                                      [--teacher DIR] [--teacher-steps 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.70
WINDOW = 5  # steps averaged for "reached" and for the final reward (bench/quickstart.py's window)
#: Overrides of examples/distill.yaml per config; grpo is examples/quickstart.yaml itself.
CONFIGS = {
    "grpo": None,
    "distill": ["--distill_reward_weight", "0.0", "--distill_kl_coef", "1.0"],
    "mix": ["--distill_reward_weight", "1.0", "--distill_kl_coef", "1.0"],
}


def _quickstart_bench():  # type: ignore[no-untyped-def]
    """bench/quickstart.py as a module (its model build is reused, not repeated here)."""
    spec = importlib.util.spec_from_file_location("bench_quickstart", ROOT / "bench" / "quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class RunResult:
    config: str
    seed: int
    steps: int
    reached_step: int | None
    reached_s: float | None
    final: float
    wall_s: float


def train(config: Path, overrides: list[str], run_dir: Path, env: dict[str, str]) -> float:
    """``telescope train`` to the end; returns its wall time (start-up included)."""
    telescope = Path(sys.executable).with_name("telescope")
    cmd = [str(telescope), "train", str(config), "--run_dir", str(run_dir), "--overwrite", "true", *overrides]
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return time.time() - start


def read_result(config: str, seed: int, run_dir: Path, wall: float) -> RunResult:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["metrics"]["reward/mean"] for r in rows]
    first = rows[0]
    start = first["time"] - first["metrics"].get("perf/step_time_s", 0.0)  # the first step's start
    reached = next(
        (k for k in range(WINDOW, len(rewards) + 1) if sum(rewards[k - WINDOW : k]) / WINDOW >= TARGET), None
    )
    reached_s = rows[reached - 1]["time"] - start if reached is not None else None
    final = sum(rewards[-WINDOW:]) / len(rewards[-WINDOW:])
    return RunResult(config, seed, len(rows), reached, reached_s, final, wall)


def make_teacher(steps: int, runs: Path, env: dict[str, str]) -> Path:
    """The quickstart trained ``steps`` steps, its last checkpoint as a Hugging Face folder."""
    run_dir = runs / "teacher"
    overrides = ["--number_of_steps", str(steps), "--checkpoint_every", str(steps), "--seed", "0"]
    wall = train(ROOT / "examples" / "quickstart.yaml", overrides, run_dir, env)
    result = read_result("teacher", 0, run_dir, wall)
    print(f"teacher: {steps} steps in {wall:.0f} s, final reward {result.final:.3f}", flush=True)
    out = runs / "teacher-hf"
    telescope = Path(sys.executable).with_name("telescope")
    checkpoint = run_dir / "checkpoints" / f"step_{steps}"
    subprocess.run(
        [str(telescope), "checkpoint", "convert", str(checkpoint), "--out", str(out)], env=env, check=True
    )
    return out


def print_table(results: list[RunResult]) -> None:
    print(
        f"{'config':>8} {'seed':>4} {'steps':>5} {'->0.70 step':>11} {'->0.70 s':>8} {'final':>6} {'wall s':>7}"
    )
    for r in results:
        step = str(r.reached_step) if r.reached_step is not None else "-"
        secs = f"{r.reached_s:.0f}" if r.reached_s is not None else "-"
        print(f"{r.config:>8} {r.seed:>4} {r.steps:>5} {step:>11} {secs:>8} {r.final:>6.3f} {r.wall_s:>7.0f}")
    for name in dict.fromkeys(r.config for r in results):
        rows = [r for r in results if r.config == name]
        hit = [r for r in rows if r.reached_step is not None]
        steps = f"{sum(r.reached_step or 0 for r in hit) / len(hit):.1f}" if hit else "-"
        secs = f"{sum(r.reached_s or 0.0 for r in hit) / len(hit):.0f}" if hit else "-"
        final = sum(r.final for r in rows) / len(rows)
        print(
            f"{name}: reached 0.70 in {len(hit)}/{len(rows)} seeds, mean {steps} steps / {secs} s to get there; "
            f"final reward mean {final:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=60, help="training steps of every compared run")
    parser.add_argument("--configs", default="grpo,distill,mix")
    parser.add_argument("--teacher", type=Path, default=None, help="a teacher folder to reuse (skips step 1)")
    parser.add_argument("--teacher-steps", type=int, default=100)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs (and the teacher) here")
    parser.add_argument(
        "--cache", type=Path, default=None, help="model cache to reuse (default: a fresh one)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="telescope-bench-distill-"))
    runs = args.keep or work
    runs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TELESCOPE_CACHE_DIR=str(args.cache or work / "cache"))
    try:
        built = _quickstart_bench().build_model(ROOT / "examples" / "quickstart.yaml", env)
        print(f"model build (once; 0 s when --cache holds it): {built:.0f} s", flush=True)
        teacher = args.teacher.resolve() if args.teacher else make_teacher(args.teacher_steps, runs, env)
        results = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            for name in args.configs.split(","):
                extra = CONFIGS[name]
                config = ROOT / "examples" / ("quickstart.yaml" if extra is None else "distill.yaml")
                overrides = ["--number_of_steps", str(args.steps), "--seed", str(seed)]
                if extra is not None:
                    overrides += ["--distill_teacher_model", str(teacher), *extra]
                run_dir = runs / f"{name}-seed{seed}"
                wall = train(config, overrides, run_dir, env)
                results.append(read_result(name, seed, run_dir, wall))
                r = results[-1]
                print(
                    f"{name} seed {seed}: reached {r.reached_step}, final {r.final:.3f}, {wall:.0f} s",
                    flush=True,
                )
        print_table(results)
        if args.keep:
            print(f"runs kept under {runs}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
