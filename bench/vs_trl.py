"""Telescope vs TRL's ``GRPOTrainer`` on identical workloads, each run in a fresh process.

Run: ``.venv/bin/python bench/vs_trl.py [--workloads tiny,24m,long] [--rounds 2] [--runs ...]``
(needs the bench extra: ``pip install -e '.[bench]'``, i.e. ``trl``).

For every workload one random Qwen2-architecture model (``telescope.core.models.tiny``: a
locally trained byte-level BPE tokenizer, ``save_pretrained``) is built once and loaded by both
frameworks, and one prompt file is written that both read. Both train GRPO on one-word
``reverse_text`` prompts (the same system prompt, chat template and LCS reward), 4 prompts x 8
completions per step, lr 1e-3 (constant), temperature 1, fp32, no KL term, one gradient step
per batch.

Runs (``--runs``, each its own subprocess, started only when no process of an earlier run of
this benchmark is alive; the harness's own process imports neither torch nor Ray):
- ``trl-standalone``: bench/trl_standalone.py, a plain TRL script as a user writes it (no
  Telescope import, no wrapper): the reference the harness's TRL figure is checked against;
- ``trl``: TRL as the harness runs it (a ``generate`` timer, the reward from
  ``telescope.envs``) with the settings a user picks for these tiny CPU models: 2 torch
  threads, gradient checkpointing off. The ratio columns use the faster of this and the
  standalone figure, and the gap column shows how far apart the two are;
- ``trl-defaults``: the same with TRL's own defaults for what is left open (gradient
  checkpointing on);
- ``sync`` / ``async``: Telescope's ``run_training`` (Ray, the transformers engine, the FSDP
  backend on 1 rank) with ``max_async_rollout`` 0 / 1, threads chosen by its own rule
  (``telescope.core.cluster.threads``; recorded in run.json) unless ``--threads``.
Every child process carries an environment tag; after it exits, processes with this run's tag
(Ray's daemons and workers) get 20 s to end and are then killed; each kill is reported. Ray
processes of other programs on the machine are counted and shown, never touched.

Workloads (``--workloads``):
- ``tiny``: ~0.33M parameters (hidden 128, 2 layers), <= 16 completion tokens (overhead bound);
- ``24m``: ~24M parameters (hidden 512, 8 layers), <= 64 completion tokens;
- ``long``: the tiny shape (hidden 128, 2 layers; ~0.38M parameters, the embedding sized to
  its 686-token vocabulary) and <= 1024 completion tokens: a random model ends a completion
  with probability ~1/686 per token, so lengths vary widely (1 to 1,024; the first step's mean
  ~530, about half >= 512; training at lr 1e-3 shortens them to a mean of ~320-400). The
  model is small so that one round of both frameworks takes minutes on 2 cores; what the
  workload measures is padding in training and batching in generation, not FLOPs.

Timing: the machine may be shared, so the runs are interleaved: each round runs every run kind
for every workload; each run's first ``warmup`` steps are left out and its median step time
kept. The tables show the median over rounds and the best round (other load only ever slows a
run down, and two-thread runs suffer most from it), with the load average
(``os.getloadavg()``) when each run started; every step time is also written to
``results.json`` in the printed folder. Telescope's s/step is its ``timing_step_total`` (wall
time from one step's end to the next, generation included); TRL's is the wall time between
``on_step_end`` callbacks. The ratio is TRL s/step / Telescope s/step (> 1: Telescope faster).
Telescope's phases are its trainer timers plus ``tl_*`` windows read from the run's timeline
events (``timeline_phases``: generation, reward tail, the train_step call, weight sync and the
driver's remainder). The two frameworks sample their own completions, so their mean lengths
differ: tok/s (completion tokens per second: 32 x mean length / s/step) and its ratio compare
the work done per second; the shortest and longest completion show how much lengths varied.
Figures are wall-clock and machine-dependent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telescope.core.models.demo_tasks import REVERSE_WORDS
from telescope.core.models.tiny import TinyModelSpec

PROMPTS_PER_STEP, GROUP_SIZE, LR, TRL_THREADS = 4, 8, 1e-3, 2
# The system prompt of the workloads issue #22 measured (reverse_text's default then; it is a
# short one now): pinned so this benchmark's figures stay comparable across versions.
SYSTEM_PROMPT = (
    "Reverse the text the user gives you, character by character. Reply with the reversed text only."
)
RUN_KINDS = ("trl-standalone", "trl", "trl-defaults", "sync", "async")
TELESCOPE_MODES = {"sync": 0, "async": 1}
# The environment variable every child carries, so that what it leaves behind is found (and
# only that: Ray processes of other programs never carry this run's value).
TAG_VAR = "TELESCOPE_VS_TRL_RUN"
LEFTOVER_GRACE_S = 20.0
HERE = Path(__file__).resolve().parent


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
    leftovers: list[str] = field(default_factory=list)
    """This run's processes still alive after it ended (killed by the harness): ``pid name``."""
    other_ray: int = 0
    """Ray processes of other programs alive when this run started (not touched)."""
    step_tokens: list[float] = field(default_factory=list)
    """Mean completion tokens of every step, warm-up included (lengths drift as training goes)."""

    @property
    def median(self) -> float:
        return statistics.median(self.step_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- processes -----------------------------------------------------------------------------
def _proc_names(match: Any) -> dict[int, str]:
    """``pid -> command name`` of this user's processes whose environment ``match`` accepts."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone, or another user's
            continue
        if match(env, name):
            found[int(entry.name)] = name
    return found


def tagged(prefix: str) -> dict[int, str]:
    """Processes whose tag starts with ``prefix`` (this benchmark invocation's runs)."""
    key = f"{TAG_VAR}={prefix}".encode()
    return _proc_names(lambda env, _name: any(v.startswith(key) for v in env))


def other_ray(prefix: str) -> int:
    """Ray daemons and workers alive that are not this benchmark's (other programs': left alone)."""
    key = f"{TAG_VAR}={prefix}".encode()
    ray_names = ("raylet", "gcs_server", "ray::", "dashboard", "log_monitor")
    return len(
        _proc_names(
            lambda env, name: (
                any(name.startswith(r) for r in ray_names) and not any(v.startswith(key) for v in env)
            )
        )
    )


def reap(prefix: str, grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """Wait for this benchmark's processes to end; kill the ones still there after the grace period.

    Ray's daemons normally end a few seconds after their driver; one that does not would hold
    cores and memory through the next run, which then measures two things at once.
    """
    deadline = time.monotonic() + grace_s
    while (alive := tagged(prefix)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not alive:
        return []
    for pid in alive:
        _signal(pid, signal.SIGTERM)
    time.sleep(5.0)
    for pid in tagged(prefix):
        _signal(pid, signal.SIGKILL)
    return [f"{pid} {name}" for pid, name in sorted(alive.items())]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def run_child(argv: list[str], tag: str, log: Path) -> None:
    """Run one child process with this run's tag, its output in ``log``; name the log on failure."""
    env = {**os.environ, TAG_VAR: tag}
    with log.open("w") as out:
        try:
            done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
        except BaseException:  # Ctrl-C or SIGTERM: the run's processes must not outlive the harness
            reap(tag, grace_s=2.0)
            raise
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{argv[1:4]} exited with {done.returncode}; its log {log} ends:\n{tail}")


# --- inputs --------------------------------------------------------------------------------
def write_prompts(path: Path, n: int, seed: int) -> None:
    """One-word reverse prompts in the conversational format reverse_text uses (read by both TRL runs)."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            word = rng.choice(REVERSE_WORDS)
            prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": word}]
            f.write(json.dumps({"prompt": prompt, "answer": word[::-1]}) + "\n")


def build_model(wl: Workload, target: Path) -> int:
    """Build the workload's model folder (child process); its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from telescope.core.models.tiny import build_tiny_model

    target.parent.mkdir(parents=True, exist_ok=True)
    build_tiny_model(wl.spec, target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())


# --- TRL -----------------------------------------------------------------------------------
def trl_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    from telescope.envs.reverse_text import reverse_reward

    return [reverse_reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]


def run_trl(
    model_dir: str, prompts: Path, wl: Workload, root: Path, threads: int, checkpointing: bool
) -> RunResult:
    import torch
    from datasets import Dataset
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
    # Only what differs between the two TRL runs is passed conditionally: ``trl-defaults`` leaves
    # gradient checkpointing to GRPOConfig's default (on in TRL 1.x).
    extra = {} if checkpointing else {"gradient_checkpointing": False}
    args = GRPOConfig(
        output_dir=str(root / f"trl-{time.time_ns()}"),
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
        **extra,
    )
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.train()
    steps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)][wl.warmup :]
    every = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    logged = every[wl.warmup :]
    return RunResult(
        steps,
        load,
        statistics.mean(h["completions/mean_length"] for h in logged) if logged else float("nan"),
        {"generate": statistics.median(gen_s[wl.warmup :])} if len(gen_s) > wl.warmup else {},
        min((h["completions/min_length"] for h in logged), default=float("nan")),
        max((h["completions/max_length"] for h in logged), default=float("nan")),
        step_tokens=[h["completions/mean_length"] for h in every],
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
    every = [json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = every[wl.warmup :]
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
        step_tokens=[r["tokens/completion/mean"] for r in every],
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


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_table(
    title: str, pick: Any, params: dict[str, int], results: dict[str, dict[str, list[RunResult]]]
) -> None:
    """One row per workload; the reference TRL figure is the faster of standalone and harness."""
    print(f"\n{title}\n")
    print(
        "| workload | params | TRL standalone s/step | TRL harness s/step (GC off) | harness / standalone | "
        "TRL defaults s/step (GC on) | Telescope sync s/step | Telescope async s/step | "
        "Telescope vs TRL (best mode) | TRL tok/s | Telescope best tok/s | tok/s ratio | "
        "load (1 min) at each run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, by in results.items():
        fig = {k: pick(runs) for k, runs in by.items() if runs}
        trl_kinds = [k for k in ("trl-standalone", "trl") if k in fig]
        tele = [k for k in TELESCOPE_MODES if k in fig]
        gap = fig["trl"] / fig["trl-standalone"] if len(trl_kinds) == 2 else None
        cells = [fmt(fig.get(k)) for k in ("trl-standalone", "trl")] + [
            "-" if gap is None else f"{gap:.2f}x",
            *(fmt(fig.get(k)) for k in ("trl-defaults", "sync", "async")),
        ]
        if trl_kinds and tele:
            ref = min(trl_kinds, key=fig.__getitem__)
            mode = min(tele, key=fig.__getitem__)
            trl_tok, tele_tok = tokens_per_s(by[ref], fig[ref]), tokens_per_s(by[mode], fig[mode])
            cells += [f"{fig[ref] / fig[mode]:.2f}x ({mode})", f"{trl_tok:.0f}", f"{tele_tok:.0f}"]
            cells.append(f"{tele_tok / trl_tok:.2f}x")
        else:
            cells += ["-"] * 4
        loads = " ".join(f"{k}:" + "/".join(f"{r.load:.1f}" for r in runs) for k, runs in by.items() if runs)
        print(f"| {name} | {params[name] / 1e6:.2f}M | " + " | ".join(cells) + f" | {loads} |")


def print_tables(params: dict[str, int], results: dict[str, dict[str, list[RunResult]]]) -> None:
    print_table("Median over rounds (of each run's median step):", median_of, params, results)
    print_table("Best round (each run's median step; the least disturbed run):", best_of, params, results)
    print(
        "\nmean (shortest-longest) completion tokens, TRL generate s/step, Telescope phases (median over runs "
        "of median s/step):"
    )
    for name, by in results.items():
        for kind in ("trl", "trl-defaults"):
            if by.get(kind):
                gen = statistics.median(r.phases.get("generate", float("nan")) for r in by[kind])
                print(f"- {name}: {kind} {lengths(by[kind])} tokens, generate {gen:.3f} s/step")
        for mode in TELESCOPE_MODES:
            if not by.get(mode):
                continue
            runs = by[mode]
            keys = sorted({k for r in runs for k in r.phases})
            ph = ", ".join(f"{k} {statistics.median(r.phases.get(k, 0.0) for r in runs):.3f}" for k in keys)
            print(f"  Telescope {mode}: {lengths(runs)} tokens; {ph}")
    print("\nmean completion tokens of each step, warm-up included (one list per run):")
    for name, by in results.items():
        for kind, runs in by.items():
            if runs:
                print(
                    f"- {name} {kind}: "
                    + "; ".join(" ".join(f"{x:.0f}" for x in r.step_tokens) for r in runs)
                )
    left = [(name, k, r.leftovers) for name, by in results.items() for k, runs in by.items() for r in runs]
    killed = [f"{n} {k}: {', '.join(x)}" for n, k, x in left if x]
    print("\nprocesses of a run still alive 20 s after it ended (killed): " + ("; ".join(killed) or "none"))
    others = max((r.other_ray for by in results.values() for runs in by.values() for r in runs), default=0)
    print(f"Ray processes of other programs seen at a run's start (left alone): up to {others}")


def lengths(runs: list[RunResult]) -> str:
    """Mean completion length over the runs, with the shortest and longest completion seen."""
    mean = statistics.mean(r.completion_tokens for r in runs)
    return f"{mean:.1f} ({min(r.shortest for r in runs):.0f}-{max(r.longest for r in runs):.0f})"


def save(results: dict[str, dict[str, list[RunResult]]], path: Path) -> None:
    raw = {
        n: {k: [dataclasses.asdict(r) for r in runs] for k, runs in by.items()} for n, by in results.items()
    }
    path.write_text(json.dumps(raw, indent=1))


# --- driver --------------------------------------------------------------------------------
def child_main(a: argparse.Namespace) -> None:
    """One run in this (fresh) process; its ``RunResult`` as JSON in ``--out``."""
    wl = workload(a.workload, a.steps)
    out = Path(a.out)
    if a.child == "build":
        out.write_text(json.dumps({"params": build_model(wl, Path(a.model_dir))}))
        return
    root = Path(a.root)
    if a.child in ("trl", "trl-defaults"):
        threads = a.threads or TRL_THREADS
        result = run_trl(a.model_dir, Path(a.prompts), wl, root, threads, a.child == "trl-defaults")
    else:
        result = run_telescope(a.model_dir, wl, TELESCOPE_MODES[a.child], root, a.threads)
    out.write_text(json.dumps(dataclasses.asdict(result)))


def workload(name: str, steps: int | None) -> Workload:
    wl = WORKLOADS[name]
    return dataclasses.replace(wl, steps=steps) if steps else wl


def child_argv(
    kind: str, name: str, wl: Workload, files: dict[str, Path], out: Path, a: argparse.Namespace
) -> list[str]:
    """The command line of one run: the standalone TRL script, or this file in child mode."""
    if kind == "trl-standalone":
        return [
            sys.executable,
            str(HERE / "trl_standalone.py"),
            f"--model-dir={files['model']}",
            f"--prompts={files['prompts']}",
            f"--max-tokens={wl.max_tokens}",
            f"--steps={wl.warmup + wl.steps}",
            f"--warmup={wl.warmup}",
            f"--threads={a.threads or TRL_THREADS}",
            f"--out={out}",
        ]
    argv = [sys.executable, str(Path(__file__).resolve()), f"--child={kind}", f"--workload={name}"]
    argv += [f"--model-dir={files['model']}", f"--prompts={files['prompts']}", f"--out={out}"]
    argv += [f"--root={files['root']}"] + ([f"--steps={a.steps}"] if a.steps else [])
    return argv + ([f"--threads={a.threads}"] if a.threads else [])


def run_one(
    kind: str, name: str, wl: Workload, files: dict[str, Path], a: argparse.Namespace, tag: str
) -> RunResult:
    """One run in a fresh process, after the previous run's processes are gone."""
    session = tag.rsplit("-", 1)[0]
    leftover_before = reap(session)  # normally nothing: the previous run was reaped after it ended
    out = files["root"] / f"{tag}.json"
    load, others = os.getloadavg()[0], other_ray(session)
    run_child(child_argv(kind, name, wl, files, out, a), tag, files["root"] / f"{tag}.log")
    raw = json.loads(out.read_text())
    if kind == "trl-standalone":
        result = RunResult(raw["step_s"], load, raw["completion_tokens"], step_tokens=raw["step_tokens"])
    else:
        result = RunResult(**raw)
    result.load, result.other_ray = load, others
    result.leftovers = leftover_before + reap(tag)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tiny,24m,long")
    parser.add_argument("--runs", default=",".join(RUN_KINDS), help=f"run kinds, of {', '.join(RUN_KINDS)}")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats of every run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default per workload)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads of every process (default: {TRL_THREADS} for TRL, Telescope's own rule). On a "
        "machine busy with other work, 1 avoids OpenMP stalls that make multi-thread timings meaningless",
    )
    for hidden in ("--child", "--workload", "--model-dir", "--prompts", "--out", "--root"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    a = parser.parse_args()
    # SIGTERM (``timeout``, ``kill``) unwinds like Ctrl-C, so the running child is reaped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if a.child:
        child_main(a)
        return
    kinds = [k for k in a.runs.split(",") if k]
    if bad := sorted(set(kinds) - set(RUN_KINDS)):
        raise SystemExit(f"--runs: unknown run kind(s) {bad}; pick from {', '.join(RUN_KINDS)}")
    root = Path(tempfile.mkdtemp(prefix="telescope-bench-vs-trl-"))
    session = f"vs-trl-{uuid.uuid4().hex[:8]}"
    names = a.workloads.split(",")
    params: dict[str, int] = {}
    files: dict[str, dict[str, Path]] = {}
    for name in names:
        wl = workload(name, a.steps)
        f = {"root": root, "model": root / "models" / name, "prompts": root / f"prompts-{name}.jsonl"}
        write_prompts(f["prompts"], 64 * (wl.warmup + wl.steps), seed=0)
        out = root / f"build-{name}.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--child=build", f"--workload={name}"]
        run_child(
            argv + [f"--model-dir={f['model']}", f"--out={out}"], f"{session}-build", root / "build.log"
        )
        reap(f"{session}-build")
        params[name], files[name] = json.loads(out.read_text())["params"], f
    results: dict[str, dict[str, list[RunResult]]] = {n: {k: [] for k in kinds} for n in names}
    n_run = 0
    for r in range(a.rounds):
        for name in names:
            for kind in kinds:
                n_run += 1
                res = run_one(kind, name, workload(name, a.steps), files[name], a, f"{session}-{n_run}")
                results[name][kind].append(res)
                killed = f"; killed leftovers: {', '.join(res.leftovers)}" if res.leftovers else ""
                print(
                    f"[round {r}] {name} {kind} {res.median:.3f} s/step (load {res.load:.1f}{killed})",
                    flush=True,
                )
                save(results, root / "results.json")
    threads = f"{a.threads} torch thread(s) everywhere" if a.threads else "TRL 2 threads, Telescope's rule"
    print(
        f"\n{os.cpu_count()} cores; {threads}; {a.rounds} interleaved rounds; raw step times in {root / 'results.json'}"
    )
    print_tables(params, results)


if __name__ == "__main__":
    main()
