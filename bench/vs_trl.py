"""Telescope vs TRL's ``GRPOTrainer``, side by side in one run, on identical workloads.

Run: ``.venv/bin/python bench/vs_trl.py [--workloads tiny,24m,long] [--rounds 2] [--modes sync,async]``
(needs the bench extra: ``pip install -e '.[bench]'``, i.e. ``trl``).

For every workload one random Qwen2-architecture model (``telescope.core.models.tiny``: a
locally trained byte-level BPE tokenizer, ``save_pretrained``) is built once and loaded by both
frameworks. Both train GRPO on one-word ``reverse_text`` prompts (the same system prompt, chat
template and LCS reward), 4 prompts x 8 completions per step, lr 1e-3 (constant), temperature
1, fp32, no KL term, one gradient step per batch, gradient checkpointing as each framework's
default (TRL: on; Telescope: off on CPU). TRL runs in this process with 2 torch threads and its defaults otherwise
(HF ``generate``); Telescope runs ``run_training`` (Ray, the transformers engine, the FSDP
backend on 1 rank) in sync (``max_async_rollout: 0``) and async (``1``) mode, threads chosen by
its own rule (``telescope.core.cluster.threads``; recorded in run.json).

Workloads (``--workloads``):
- ``tiny``: ~0.33M parameters (hidden 128, 2 layers), <= 16 completion tokens (overhead bound);
- ``24m``: ~24M parameters (hidden 512, 8 layers), <= 64 completion tokens;
- ``long``: the tiny shape (hidden 128, 2 layers; ~0.38M parameters, the embedding sized to
  its 686-token vocabulary) and <= 1024 completion tokens: a random model ends a completion
  with probability ~1/686 per token, so lengths vary widely (1 to 1,024; the first step's mean
  ~530, about half >= 512; training at lr 1e-3 shortens them to a mean of ~320-400). The
  model is small so that one round of both frameworks takes minutes on 2 cores (HF ``generate``
  over 1,024 tokens took ~8 min per step with a 2.4M model on a busy machine); what the workload
  measures is padding in training and batching in generation, not FLOPs.

Timing: the machine may be shared, so the runs are interleaved: each round runs TRL, then
Telescope sync, then Telescope async, for every workload; each run's first ``warmup`` steps are
left out and its median step time kept. The tables show the median over rounds and the best
round (other load only ever slows a run down, and two-thread runs suffer most from it), with
the load average (``os.getloadavg()``) when each run started; every step time is also written
to ``results.json`` in the printed folder. Telescope's s/step is its
``timing_step_total`` (wall time from one step's end to the next, generation included); TRL's is
the wall time between ``on_step_end`` callbacks. The ratio is TRL s/step / Telescope s/step
(> 1: Telescope faster). Telescope's phases are its trainer timers plus ``tl_*`` windows read
from the run's timeline events (``timeline_phases``: generation, reward tail, the train_step
call, weight sync and the driver's remainder). The two frameworks sample their own completions, so their mean lengths
differ: tok/s (completion tokens per second: 32 x mean length / s/step) and its ratio compare the
work done per second; the shortest and longest completion show how much lengths varied.
Figures are wall-clock and machine-dependent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telescope.core.models.demo_tasks import REVERSE_WORDS
from telescope.core.models.tiny import TinyModelSpec, build_tiny_model

PROMPTS_PER_STEP, GROUP_SIZE, LR, TRL_THREADS = 4, 8, 1e-3, 2
# The system prompt of the workloads issue #22 measured (reverse_text's default then; it is a
# short one now): pinned so this benchmark's figures stay comparable across versions.
SYSTEM_PROMPT = (
    "Reverse the text the user gives you, character by character. Reply with the reversed text only."
)


@dataclass(frozen=True)
class Workload:
    """One model shape and completion limit, with how many steps each run times."""

    spec: TinyModelSpec
    max_tokens: int
    steps: int
    warmup: int
    seq_len: int


WORKLOADS = {
    "tiny": Workload(TinyModelSpec(128, 2, 4, 2, 256), max_tokens=16, steps=16, warmup=3, seq_len=2048),
    "24m": Workload(TinyModelSpec(512, 8, 8, 4, 1408), max_tokens=64, steps=5, warmup=2, seq_len=2048),
    "long": Workload(
        TinyModelSpec(128, 2, 4, 2, 256, vocab_size=2048), max_tokens=1024, steps=3, warmup=1, seq_len=4096
    ),
}


@dataclass
class RunResult:
    """One framework's run of one workload."""

    step_s: list[float]
    load: float
    completion_tokens: float = float("nan")
    phases: dict[str, float] = field(default_factory=dict)
    shortest: float = float("nan")
    """Fewest completion tokens of one completion over the timed steps."""
    longest: float = float("nan")
    """Most completion tokens of one completion over the timed steps."""

    @property
    def median(self) -> float:
        return statistics.median(self.step_s)


def build_model(name: str, wl: Workload, root: Path) -> tuple[str, int]:
    """The workload's model folder (built once) and its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    target = root / "models" / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        build_tiny_model(wl.spec, target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return str(target), sum(p.numel() for p in model.parameters())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- TRL -----------------------------------------------------------------------------------
def trl_dataset(n: int, seed: int) -> Any:
    """One-word reverse prompts in the conversational format reverse_text uses."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = rng.choice(REVERSE_WORDS)
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": word}]
        rows.append({"prompt": prompt, "answer": word[::-1]})
    return Dataset.from_list(rows)


def trl_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    from telescope.envs.reverse_text import reverse_reward

    return [reverse_reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]


def run_trl(model_dir: str, wl: Workload, root: Path, threads: int) -> RunResult:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    load = os.getloadavg()[0]
    stamps: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generate, gen_s = model.generate, []

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        gen_s.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate
    n_steps = wl.warmup + wl.steps
    args = GRPOConfig(
        output_dir=str(root / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=wl.max_tokens,
        learning_rate=LR,
        lr_scheduler_type="constant",
        temperature=1.0,
        beta=0.0,
        max_steps=n_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=args,
        train_dataset=trl_dataset(64 * n_steps, seed=0),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.train()
    steps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)][wl.warmup :]
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h][wl.warmup :]
    return RunResult(
        steps,
        load,
        statistics.mean(h["completions/mean_length"] for h in logged) if logged else float("nan"),
        {"generate": statistics.median(gen_s[wl.warmup :])} if len(gen_s) > wl.warmup else {},
        min((h["completions/min_length"] for h in logged), default=float("nan")),
        max((h["completions/max_length"] for h in logged), default=float("nan")),
    )


# --- Telescope -----------------------------------------------------------------------------
def run_telescope(model_dir: str, wl: Workload, max_async: int, root: Path, threads: int | None) -> RunResult:
    from telescope.core.config import load_config
    from telescope.core.plugins import load_plugins
    from telescope.core.runtime import run_training

    load = os.getloadavg()[0]
    pset, registry = load_plugins()
    run_dir = root / f"telescope-{time.time_ns()}"
    cfg = load_config(
        None,
        {
            "model": model_dir,
            "model_dtype": "float32",
            "mixed_precision_dtype": None,
            "environments": [
                {
                    "name": "reverse_text",
                    "kwargs": {"min_words": 1, "max_words": 1, "system_prompt": SYSTEM_PROMPT},
                }
            ],
            "inference_engine": "transformers",
            "inference_num_workers": 1,
            "trainer_num_workers": 1,
            "ray_inference_cpus_per_worker": 1.0,
            "ray_trainer_cpus_per_worker": 1.0,
            "ray_address": "local",
            "inference_base_port": free_port(),
            "group_size": GROUP_SIZE,
            "prompts_batch_size_for_trainer": PROMPTS_PER_STEP,
            "number_of_steps": wl.warmup + wl.steps,
            "max_async_rollout": max_async,
            "max_tokens": wl.max_tokens,
            "seq_len": wl.seq_len,
            "pad_to_multiple_of": 8,
            "learning_rate": LR,
            "temperature": 1.0,
            "discard_group_zero_advantage": False,
            "eval_before_training": False,
            "eval_after_training": False,
            "use_wandb": False,
            "run_dir": str(run_dir),
            "seed": 0,
            "trainer_torch_threads": threads,
            "inference_torch_threads": threads,
        },
        registry,
    )
    run_training(cfg, pset, registry)
    rows = [json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = rows[wl.warmup :]
    phases = {
        k.removeprefix("timing_").removesuffix("_total"): statistics.median(r.get(k, 0.0) for r in rows)
        for k in sorted({k for r in rows for k in r if k.startswith("timing_") and k.endswith("_total")})
    }
    phases.update(timeline_phases(run_dir, wl.warmup))
    return RunResult(
        [r["timing_step_total"] for r in rows],
        load,
        statistics.mean(r["tokens/completion/mean"] for r in rows),
        phases,
        min(r["tokens/completion/min"] for r in rows),
        max(r["tokens/completion/max"] for r in rows),
    )


def timeline_phases(run_dir: Path, warmup: int) -> dict[str, float]:
    """Median per-step windows from the run's timeline events (``events/block_*``).

    ``tl_generation``: first generation start to last generation end of the step's samples;
    ``tl_reward_tail``: last generation end to last reward end; ``tl_train_call``: the
    ``train_step`` call from the driver (Ray round trip included; compare with the backend's
    forward/backward/... timers); ``tl_weight_sync``: the sync call; ``tl_other``: the step time
    outside these four (driver work between phases: batching, metrics, hooks, dispatch), only
    where they do not overlap (sync mode; in async mode generation overlaps training).
    """
    from telescope.core.observe.rundir.reader import RunDirReader

    events: dict[int, dict[tuple[str, str], list[float]]] = {}
    for e in RunDirReader(run_dir).events():
        by_kind = events.setdefault(int(e.get("step") or 0), {})
        by_kind.setdefault((e["type"], e["phase"]), []).append(e["time"])
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    metrics = {row["step"]: row["metrics"] for row in rows}
    out: dict[str, list[float]] = {}
    for step in sorted(metrics)[warmup:]:
        ev = events.get(step, {})
        if not ev.get(("generation", "start")) or not ev.get(("trainer", "start")):
            continue
        gen = (min(ev[("generation", "start")]), max(ev[("generation", "end")]))
        windows = {
            "tl_generation": gen[1] - gen[0],
            "tl_reward_tail": max(ev.get(("reward", "end"), [gen[1]])) - gen[1],
            "tl_train_call": ev[("trainer", "end")][0] - ev[("trainer", "start")][0],
            "tl_weight_sync": ev[("weight_sync", "end")][0] - ev[("weight_sync", "start")][0],
        }
        other = metrics[step]["timing_step_total"] - sum(windows.values())
        if other >= 0:  # else the windows overlap (async mode): no remainder to show
            windows["tl_other"] = other
        for k, v in windows.items():
            out.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in out.items()}


# --- report --------------------------------------------------------------------------------
def median_of(runs: list[RunResult]) -> float:
    return statistics.median(r.median for r in runs)


def best_of(runs: list[RunResult]) -> float:
    return min(r.median for r in runs)


def tokens_per_s(runs: list[RunResult], step_s: float) -> float:
    """Completion tokens generated and trained per second at ``step_s`` (lengths differ by framework)."""
    return PROMPTS_PER_STEP * GROUP_SIZE * statistics.mean(r.completion_tokens for r in runs) / step_s


def print_table(
    title: str, pick: Any, params: dict[str, int], results: dict[str, dict[str, list[RunResult]]]
) -> None:
    print(f"\n{title}\n")
    print(
        "| workload | params | TRL s/step | Telescope sync s/step | Telescope async s/step | TRL compl/s | "
        "Telescope best compl/s | Telescope vs TRL (best mode) | TRL tok/s | Telescope best tok/s | "
        "tok/s ratio | load (1 min) at each run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    n = PROMPTS_PER_STEP * GROUP_SIZE
    for name, by in results.items():
        trl = pick(by["trl"])
        tele = {m: pick(by[m]) for m in ("sync", "async") if by.get(m)}
        mode = min(tele, key=tele.__getitem__)
        best = tele[mode]
        trl_tok, tele_tok = tokens_per_s(by["trl"], trl), tokens_per_s(by[mode], best)
        loads = " ".join(f"{k}:" + "/".join(f"{r.load:.1f}" for r in runs) for k, runs in by.items() if runs)
        cells = [f"{tele[m]:.3f}" if m in tele else "-" for m in ("sync", "async")]
        print(
            f"| {name} | {params[name] / 1e6:.2f}M | {trl:.3f} | {cells[0]} | {cells[1]} | {n / trl:.1f} | "
            f"{n / best:.1f} | {trl / best:.2f}x | {trl_tok:.0f} | {tele_tok:.0f} | {tele_tok / trl_tok:.2f}x | "
            f"{loads} |"
        )


def print_tables(params: dict[str, int], results: dict[str, dict[str, list[RunResult]]]) -> None:
    print_table("Median over rounds (of each run's median step):", median_of, params, results)
    print_table("Best round (each run's median step; the least disturbed run):", best_of, params, results)
    print(
        "\nmean (shortest-longest) completion tokens, TRL generate s/step, Telescope phases (median over runs "
        "of median s/step):"
    )
    for name, by in results.items():
        gen = statistics.median(r.phases.get("generate", float("nan")) for r in by["trl"])
        print(f"- {name}: TRL {lengths(by['trl'])} tokens, generate {gen:.3f} s/step")
        for mode in ("sync", "async"):
            if not by.get(mode):
                continue
            runs = by[mode]
            keys = sorted({k for r in runs for k in r.phases})
            ph = ", ".join(f"{k} {statistics.median(r.phases.get(k, 0.0) for r in runs):.3f}" for k in keys)
            print(f"  Telescope {mode}: {lengths(runs)} tokens; {ph}")


def lengths(runs: list[RunResult]) -> str:
    """Mean completion length over the runs, with the shortest and longest completion seen."""
    mean = statistics.mean(r.completion_tokens for r in runs)
    return f"{mean:.1f} ({min(r.shortest for r in runs):.0f}-{max(r.longest for r in runs):.0f})"


def save(results: dict[str, dict[str, list[RunResult]]], path: Path) -> None:
    raw = {
        n: {k: [dataclasses.asdict(r) for r in runs] for k, runs in by.items()} for n, by in results.items()
    }
    path.write_text(json.dumps(raw, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tiny,24m,long")
    parser.add_argument("--modes", default="sync,async", help="Telescope modes: sync (0), async (1)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats of every run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default per workload)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads of every process (default: {TRL_THREADS} for TRL, Telescope's own rule). On a "
        "machine busy with other work, 1 avoids OpenMP stalls that make multi-thread timings meaningless",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="telescope-bench-vs-trl-"))
    names = args.workloads.split(",")
    modes = {"sync": 0, "async": 1}
    chosen = [m for m in args.modes.split(",") if m]
    workloads = {n: WORKLOADS[n] for n in names}
    if args.steps:
        workloads = {
            n: Workload(w.spec, w.max_tokens, args.steps, w.warmup, w.seq_len) for n, w in workloads.items()
        }
    built = {n: build_model(n, w, root) for n, w in workloads.items()}
    params = {n: b[1] for n, b in built.items()}
    results: dict[str, dict[str, list[RunResult]]] = {
        n: {"trl": [], **{m: [] for m in chosen}} for n in names
    }
    for r in range(args.rounds):
        for name, wl in workloads.items():
            path = built[name][0]
            res = results[name]
            res["trl"].append(run_trl(path, wl, root, args.threads or TRL_THREADS))
            print(f"[round {r}] {name} TRL {res['trl'][-1].median:.3f} s/step", flush=True)
            for mode in chosen:
                res[mode].append(run_telescope(path, wl, modes[mode], root, args.threads))
                print(f"[round {r}] {name} Telescope {mode} {res[mode][-1].median:.3f} s/step", flush=True)
            save(results, root / "results.json")
    threads = (
        f"{args.threads} torch thread(s) everywhere" if args.threads else "TRL 2 threads, Telescope's rule"
    )
    print(
        f"\n{os.cpu_count()} cores; {threads}; {args.rounds} interleaved rounds; raw step times in {root / 'results.json'}"
    )
    print_tables(params, results)


if __name__ == "__main__":
    main()
