"""The README's quickstart, measured: wall time, learning per seed, step-0 KL.

Runs `telescope train examples/quickstart.yaml` as the README does, once per seed, one run
after the other, in a fresh model cache (the one-time build of the demo model is timed on its
own, before the runs), then reads each run directory and prints one row per seed: the reward
gain (mean of the last 5 steps minus the first 5, the README's figure), both means, the mean
entropy of the first and last 5 steps, the wall time of the run (start-up included) and the
machine's load average when the run started (other load only slows a run down).

    .venv/bin/python bench/quickstart.py [--seeds 0,1,2] [--config FILE] [--keep DIR]
                                         [--cache DIR] [-- --learning_rate 1e-3 --group_size 8 ...]

Everything after `--` is passed to `telescope train` as config overrides, so variants of the
quickstart are measured the same way without editing the YAML.
"""

from __future__ import annotations

import argparse
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
WINDOW = 5  # steps averaged at each end (the README's "first five steps against the last five")
TARGET_GAIN = 0.15
TARGET_WALL_S = 600.0


@dataclass(frozen=True)
class SeedResult:
    """One quickstart run, read back from its run directory."""

    seed: int
    steps: int
    first: float
    last: float
    entropy_first: float
    entropy_last: float
    wall_s: float
    load: float
    step0_kl: float

    @property
    def gain(self) -> float:
        return self.last - self.first


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_seed(config: Path, seed: int, overrides: list[str], run_dir: Path, env: dict[str, str]) -> SeedResult:
    telescope = Path(sys.executable).with_name("telescope")
    cmd = [str(telescope), "train", str(config), "--run_dir", str(run_dir), "--seed", str(seed), *overrides]
    load = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.run(
        cmd, env=env, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wall = time.time() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f"quickstart (seed {seed}) failed with exit code {proc.returncode}")
    rows = [json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    entropy = [r["entropy"] for r in rows]
    return SeedResult(
        seed=seed,
        steps=len(rows),
        first=_mean(rewards[:WINDOW]),
        last=_mean(rewards[-WINDOW:]),
        entropy_first=_mean(entropy[:WINDOW]),
        entropy_last=_mean(entropy[-WINDOW:]),
        wall_s=wall,
        load=load,
        step0_kl=rows[0]["kl_divergence_inference"],
    )


def build_model(config: Path, env: dict[str, str]) -> float:
    """Build the config's model into the (fresh) cache; returns the seconds it took."""
    code = (
        "import sys, yaml; from telescope.core.models.tiny import resolve_model_path; "
        "resolve_model_path(yaml.safe_load(open(sys.argv[1]))['model'])"
    )
    start = time.time()
    subprocess.run([sys.executable, "-c", code, str(config)], env=env, check=True)
    return time.time() - start


def print_table(results: list[SeedResult]) -> None:
    print(
        f"{'seed':>4} {'gain':>7} {'first5':>7} {'last5':>7} {'ent0':>6} {'ent1':>6} {'wall s':>7} {'load':>5}"
    )
    for r in results:
        print(
            f"{r.seed:>4} {r.gain:>+7.3f} {r.first:>7.3f} {r.last:>7.3f} {r.entropy_first:>6.3f} "
            f"{r.entropy_last:>6.3f} {r.wall_s:>7.0f} {r.load:>5.2f}"
        )
    gains = [r.gain for r in results]
    walls = [r.wall_s for r in results]
    print(
        f"mean {_mean(gains):+7.3f}, min {min(gains):+.3f} (target >= {TARGET_GAIN:+.2f} every seed); "
        f"wall time mean {_mean(walls):.0f} s, min {min(walls):.0f} s (target <= {TARGET_WALL_S:.0f} s)"
    )
    print(f"step-0 mismatch KL (kl_divergence_inference at step 1): {max(r.step0_kl for r in results):.2e}")


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds (config field 'seed')")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories under this folder")
    parser.add_argument(
        "--cache", type=Path, default=None, help="model cache to reuse (default: a fresh one)"
    )
    args = parser.parse_args(own)
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="telescope-bench-quickstart-"))
    runs = args.keep or work
    runs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TELESCOPE_CACHE_DIR=str(args.cache or work / "cache"))
    try:
        print(f"config {args.config}, overrides {' '.join(overrides) or '(none)'}")
        print(f"model build (once; 0 s when --cache holds it): {build_model(args.config, env):.0f} s")
        results = []
        for seed in seeds:
            results.append(run_seed(args.config, seed, overrides, runs / f"seed{seed}", env))
            print(f"seed {seed}: gain {results[-1].gain:+.3f}, {results[-1].wall_s:.0f} s", flush=True)
        print_table(results)
        if args.keep:
            print(f"run directories kept under {runs}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
