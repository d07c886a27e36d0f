"""The health sentinel on runs made to fail, and on healthy ones: which finding, at which step.

Run: ``.venv/bin/python bench/health.py [--only NAME ...] [--steps N]``. Every row is one real run
of ``examples/quickstart.yaml`` (the built-in tiny model, 2 FSDP ranks, 1 transformers server,
CPU) through ``telescope train``, with every finding's action ``warn`` unless the scenario says
otherwise. Per run: how it ended, the findings it raised (``name@step``, from run.json
``info.health``) and the steps it trained. Scenarios:

- ``healthy_seed{0..4}``: the quickstart as shipped (false alarms: any finding);
- ``healthy_lora``: ``examples/quickstart_lora.yaml`` as shipped (false alarms);
- ``healthy_countdown``, ``healthy_wordle``: ``examples/countdown.yaml`` and ``wordle.yaml`` need
  Qwen2.5-3B and 16 CPUs (4 workers x 4); here the quickstart's CPU pools train a tiny model
  warm-started on the environment's own prompts and solutions (tests/health/task_models.py, built
  on first use and cached: its samples score differently within a group; the random
  ``telescope/tiny`` scores 0 on every sample, and ``reward_saturated`` is then a true finding),
  ``max_tokens`` 64 / 32 (1024 / 512 shipped), wordle with 2 turns, learning rate 1e-4 (at the
  quickstart's 5e-4 both runs degenerate: true findings, docs/health.md), and zero-advantage groups
  kept so that steps complete and every step rule judges them (false alarms: any finding); the two
  print their mean reward over the first and the last 5 steps;
- ``lr_20x``, ``lr_100x``: learning rate 0.01 and 0.05 (the shipped 5e-4 x 20 and x 100);
- ``length_game``: ``reverse_text_lengthy`` (tests/health/faulty_envs.py), whose reward pays for length;
- ``constant_reward``: ``reverse_text_constant``, every completion scores 1.0;
- ``nan_loss``: ``TELESCOPE_FAULTS=train_loss_nan@6``;
- ``lr_100x_stop``: lr_100x with ``kl_spike`` and ``entropy_collapse`` set to ``stop``;
- ``rollback``: lr 0.05 warmed up over 50 steps (step 1 at 0.001), a checkpoint every step, ``kl_spike`` set to
  ``rollback`` with ``health_kl_spike_max`` 0.5 and ``health_rollback_lr_factor`` 0.02: the reward before, at and after the rollback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS = str(ROOT / "tests" / "health" / "faulty_envs.py")
WARN = {"health_reward_saturated_groups": 64}

SCENARIOS: dict[str, dict[str, Any]] = {
    **{f"healthy_seed{s}": {"seed": s} for s in range(5)},
    "healthy_lora": {"base": "quickstart_lora.yaml"},
    **{
        f"healthy_{env}": {
            "task_model": env,
            "environments": [{"name": env, "reward_min": 0.0, "reward_max": top, **kwargs}],
            "max_tokens": tokens,
            "discard_group_zero_advantage": False,
            "stall_timeout_s": 120.0,
            "learning_rate": 1e-4,  # 5e-4 (the quickstart's) made both degenerate: docs/health.md
        }
        for env, top, tokens, kwargs in (
            ("countdown", 2.0, 64, {}),
            ("wordle", 2.2, 32, {"kwargs": {"max_turns": 2}}),
        )
    },
    "lr_20x": {"learning_rate": 0.01},
    "lr_100x": {"learning_rate": 0.05},
    "length_game": {"environments": [{"name": "reverse_text_lengthy"}], "plugins": [ENVS]},
    "constant_reward": {
        "environments": [{"name": "reverse_text_constant"}],
        "plugins": [ENVS],
        "stall_timeout_s": 120.0,
    },
    "nan_loss": {"faults": "train_loss_nan@6"},
    "lr_100x_stop": {
        "learning_rate": 0.05,
        "health_kl_spike_action": "stop",
        "health_entropy_collapse_action": "stop",
    },
    "rollback": {
        "learning_rate": 0.05,
        "warmup_steps": 50,
        "checkpoint_every": 1,
        "health_kl_spike_action": "rollback",
        "health_kl_spike_max": 0.5,
        "health_rollback_lr_factor": 0.02,
        "health_max_rollbacks": 1,
    },
}


def run(name: str, steps: int, out: Path, seed: int | None = None) -> dict[str, Any]:
    """Train one scenario (at ``seed`` unless it sets its own); what it raised and how it ended."""
    import yaml

    fields = dict(SCENARIOS[name])
    faults = fields.pop("faults", None)
    if "task_model" in fields:  # built on first use, then cached (tests/health/task_models.py)
        sys.path.insert(0, str(ROOT / "tests" / "health"))
        from task_models import task_model

        fields["model"] = task_model(fields.pop("task_model"))
    base = fields.pop("base", "quickstart.yaml")
    config = yaml.safe_load((ROOT / "examples" / base).read_text())
    config.update({"number_of_steps": steps, "run_dir": str(out / name), "overwrite": True, **WARN})
    config.update({**({"seed": seed} if seed is not None else {}), **fields})
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, **({"TELESCOPE_FAULTS": faults} if faults else {})}
    start = time.time()
    with (out / f"{name}.log").open("w") as log:
        code = subprocess.call(
            [sys.executable, "-c", "from telescope.cli.app import main; main()", "train", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    meta = json.loads((out / name / "run.json").read_text())
    health = (meta.get("info") or {}).get("health") or {}
    steps_rows = [
        json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line
    ]
    rollback = next((f for f in health.get("findings", []) if f["action"] == "rollback"), None)
    return {
        "rollback": rollback_figures(steps_rows, rollback) if rollback else None,
        "name": name,
        "exit": code,
        "seconds": round(time.time() - start),
        "steps": len(steps_rows),
        "findings": [f"{f['name']}@{f['step']}" for f in health.get("findings", [])],
        "state": health.get("state", "?"),
        "rewards": [round(r["metrics"].get("reward/mean", float("nan")), 3) for r in steps_rows],
        "restarts": [r.get("from_step") for r in (meta.get("info") or {}).get("restarts", [])],
    }


def rollback_figures(rows: list[dict[str, Any]], finding: dict[str, Any]) -> dict[str, Any]:
    """Mean reward before the finding's window, at the finding, and over the re-run after the restore
    (metrics.jsonl holds the abandoned steps, then the re-run from the checkpoint's next step)."""
    cut = next((i for i in range(1, len(rows)) if rows[i]["step"] <= rows[i - 1]["step"]), len(rows))
    first, after = rows[:cut], rows[cut:]

    def mean(part: list[dict[str, Any]], key: str = "reward/mean") -> float:
        values = [r["metrics"][key] for r in part if key in r["metrics"]]
        return round(sum(values) / len(values), 3) if values else float("nan")

    at = [r for r in first if r["step"] == finding["step"]]
    return {
        "onset": finding["onset"],
        "step": finding["step"],
        "restored": after[0]["step"] - 1 if after else None,
        "reward_before_window": mean([r for r in first if r["step"] < finding["onset"]]),
        "reward_in_window": mean([r for r in first if r["step"] >= finding["onset"]]),
        "reward_at_finding": mean(at),
        "reward_after": mean(after),
        "reward_after_last5": mean(after[-5:]),
        "kl_in_window": mean([r for r in first if r["step"] >= finding["onset"]], "kl_divergence_inference"),
        "kl_after": mean(after, "kl_divergence_inference"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None, help="seed of the scenarios that set none")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_health_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'scenario':<16} {'exit':>4} {'steps':>5} {'s':>5}  state        findings")
    for name in args.only:
        row = run(name, args.steps, out, args.seed)
        findings = ", ".join(row["findings"]) or "-"
        print(
            f"{name:<16} {row['exit']:>4} {row['steps']:>5} {row['seconds']:>5}  {row['state']:<12} {findings}",
            flush=True,
        )
        if row["restarts"]:
            print(f"{'':<16} restarted from steps {row['restarts']}; rewards {row['rewards']}", flush=True)
        if SCENARIOS[name].get("task_model"):
            first, last = row["rewards"][:5], row["rewards"][-5:]
            print(
                f"{'':<16} mean reward steps 1-5 {sum(first) / max(len(first), 1):.3f}, "
                f"last 5 {sum(last) / max(len(last), 1):.3f}",
                flush=True,
            )
        if row["rollback"]:
            print(f"{'':<16} rollback: {row['rollback']}", flush=True)
        (out / f"{name}.json").write_text(json.dumps(row))


if __name__ == "__main__":
    main()
