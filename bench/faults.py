"""How a real run copes with each fault ``TELESCOPE_FAULTS`` can inject, side by side.

Run: ``.venv/bin/python bench/faults.py [--steps N] [--only NAME ...]``. Every row is one real run
(local Ray, the built-in tiny model, 1 FSDP rank on gloo, 1 transformers server, CPU), with
one fault injected, and the no-fault baseline first. Per fault:

- outcome: ``finished``, or the first words of the error that ended the run;
- detect: seconds from the fault (the first time it fired, or the start of the failing
  trainer step, or the start of the stall) to the end of the run; for a killed server, to the
  start of its restart; ``-`` when nothing needs detecting (each failure is handled at once);
- recover: for a killed server, seconds from the kill to the first verified weight sync after
  its restart (it serves again); for other healed runs the time beyond the baseline; ``-`` when
  the run stopped instead;
- steps lost: steps of the run that were not trained (0 for a healed run);
- duplicated: (group, sample) pairs trained more than once (must be 0).

Figures are wall-clock on a shared machine: compare them only within one table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.core.testing import smallest_run_settings

BASE: dict[str, Any] = smallest_run_settings(group_size=2, max_tokens=6)
TWO_ENVS = [{"name": "reverse_text", "weight": 1.0}, {"name": "countdown", "weight": 4.0}]


@dataclass(frozen=True)
class Scenario:
    name: str
    spec: str
    overrides: dict[str, Any]
    fault_time: str
    """How the fault's moment is found: a ``faults.fired`` key, ``trainer:<step>`` or ``first_generation``."""


SCENARIOS = [
    Scenario("none (baseline)", "", {}, ""),
    Scenario("trainer raises at step 3", "train_step_raise@3", {}, "trainer:3"),
    Scenario("prompt 40 fails to prepare", "prompt_raise@40", {}, "prompt_raise"),
    Scenario("10% of requests fail", "request_fail=0.1", {}, ""),
    Scenario(
        "reward raises in 1 of 2 envs, 100 steps",
        "reward_raise=countdown",
        {"environments": TWO_ENVS, "number_of_steps": 100},
        "reward_raise",
    ),
    Scenario("server 0.2 s slower per request", "server_slow=0.2", {}, ""),
    Scenario("server SIGKILLed after step 5", "server_kill@5", {}, "server_kill"),
    Scenario(
        "server never answers (stall 10 s)", "server_slow=3600", {"stall_timeout_s": 10}, "first_generation"
    ),
]


@dataclass
class Row:
    name: str
    outcome: str
    detect_s: float | None
    wall_s: float
    recover_s: float | None
    steps_done: int
    steps_lost: int
    duplicated: int


def run_one(scenario: Scenario, steps: int, workdir: Path) -> Row:
    from telescope.core import faults
    from telescope.core.config import load_config
    from telescope.core.observe import RunDirReader
    from telescope.core.plugins import load_plugins
    from telescope.core.runtime import run_training

    run_dir = workdir / f"run_{len(list(workdir.iterdir()))}"  # a fresh folder per run
    os.environ.pop(faults.ENV_VAR, None)
    if scenario.spec:
        os.environ[faults.ENV_VAR] = scenario.spec
    faults.fired.clear()
    # The default inference_base_port: the run moves to a free block (claimed) when it is taken.
    settings = {**BASE, "number_of_steps": steps, "run_dir": str(run_dir), **scenario.overrides}
    pset, registry = load_plugins()
    cfg = load_config(None, settings, registry)
    start = time.time()
    outcome = "finished"
    try:
        run_training(cfg, pset, registry)
    except Exception as exc:  # noqa: BLE001 - the outcome is what we measure
        outcome = f"{type(exc).__name__}: {str(exc)[:60]}"
    end = time.time()
    os.environ.pop(faults.ENV_VAR, None)
    reader = RunDirReader(run_dir)
    done = len({int(s["step"]) for s in reader.steps()})
    steps = int(settings["number_of_steps"])
    kept = Counter((r["group_id"], r["sample_id"]) for r in reader.rollouts() if r["kept"])
    detect, recover = _heal_times(reader) if scenario.fault_time == "server_kill" else (None, None)
    if outcome != "finished":
        detect = _detect(scenario, reader, end)
    return Row(
        scenario.name,
        outcome,
        detect,
        end - start,
        recover,
        done,
        steps - done,
        sum(n - 1 for n in kept.values() if n > 1),
    )


def _heal_times(reader: Any) -> tuple[float | None, float | None]:
    """(kill -> restart begins, kill -> first verified weight sync after the restart)."""
    from telescope.core import faults

    killed = faults.fired.get("server_kill")
    events = reader.events()
    restarts = [e["time"] for e in events if e["type"] == "run" and e["name"] == "inference_restart"]
    if killed is None or not restarts:
        return None, None
    synced = [
        e["time"]
        for e in events
        if e["type"] == "weight_sync" and e["phase"] == "end" and e["time"] > restarts[0]
    ]
    return restarts[0] - killed, (min(synced) - killed) if synced else None


def _detect(scenario: Scenario, reader: Any, end: float) -> float | None:
    from telescope.core import faults

    kind = scenario.fault_time
    if kind.startswith("trainer:"):
        step = int(kind.split(":")[1])
        times = [
            e["time"]
            for e in reader.events()
            if e["type"] == "trainer" and e["phase"] == "start" and e["step"] == step
        ]
        return end - min(times) if times else None
    if kind == "first_generation":
        times = [e["time"] for e in reader.events() if e["type"] == "generation"]
        return end - min(times) if times else None
    fired = faults.fired.get(kind)
    return end - fired if fired is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", nargs="*", help="scenario names starting with these words")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.only or any(s.name.startswith(o) for o in args.only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="telescope-bench-faults-") as tmp:
        for scenario in chosen:
            rows.append(run_one(scenario, args.steps, Path(tmp)))
            print(f"  ran: {scenario.name} ({rows[-1].wall_s:.1f}s)", flush=True)
    baseline = next((r.wall_s for r in rows if r.name.startswith("none")), None)
    print(
        f"\n{args.steps} steps per run unless the name says otherwise; the columns are described in the module docstring\n"
    )
    header = (
        f"{'fault':38} {'outcome':46} {'detect s':>8} {'recover s':>9} {'steps lost':>10} {'duplicated':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        detect = f"{r.detect_s:.1f}" if r.detect_s is not None else "-"
        healed = r.outcome == "finished" and baseline is not None and not r.name.startswith("none")
        extra = (
            r.recover_s if r.recover_s is not None else (r.wall_s - baseline if healed and baseline else None)
        )
        recover = f"{max(0.0, extra):.1f}" if extra is not None else "-"
        print(
            f"{r.name:38} {r.outcome[:46]:46} {detect:>8} {recover:>9} {r.steps_lost:>10} {r.duplicated:>10}"
        )


if __name__ == "__main__":
    main()
