"""The README's quickstart, measured: wall time (model build included), learning, step-0 KL.

Runs `telescope train examples/quickstart.yaml` exactly as the README does, in a fresh model
cache so the one-time build of the demo model is timed too, then reads the run directory.

    .venv/bin/python bench/quickstart.py [--keep]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    keep = "--keep" in sys.argv  # keep the run directory (e.g. for `telescope runs show`)
    work = Path(tempfile.mkdtemp(prefix="telescope-bench-quickstart-"))
    run_dir = work / "run"
    env = dict(os.environ, TELESCOPE_CACHE_DIR=str(work / "cache"))
    telescope = Path(sys.executable).with_name("telescope")
    cmd = [str(telescope), "train", str(ROOT / "examples" / "quickstart.yaml"), "--run_dir", str(run_dir)]
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f"quickstart failed with exit code {proc.returncode}")
    rows = [json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(
        f"quickstart: {len(rows)} steps, wall time {wall:.0f} s including the model build (target <= 600 s)"
    )
    print(
        f"mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}, gain {last - first:+.3f} (target >= +0.15)"
    )
    print(f"step-0 mismatch KL (kl_divergence_inference at step 1): {rows[0]['kl_divergence_inference']:.2e}")
    if keep:
        print(f"run directory kept: {run_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
