"""Trainer throughput: packed rows (Telescope's FSDP backend) vs padded one-sample-per-row.

Run: ``.venv/bin/python bench/trainer.py [--models 2m,20m] [--dists rl,uniform] [--samples 16]``.

CPU (default): for a ~2M and a ~20M parameter random Qwen2 model, RL steps over the same
mixed-length samples (each <= seq_len 2048) are timed two ways:
- packed: ``FSDPBackend.train_step`` on first-fit-decreasing rows of <= seq_len tokens with
  restarting position ids (1 rank, gloo; attention ``auto`` = per-sample causal SDPA on CPU);
- padded: the way TRL's GRPOTrainer batches (``--padded-layout trl``): ``--padded-batch-size``
  samples per micro-batch, each sample its own row, prompts left-padded to the longest prompt
  and completions right-padded to the longest completion *of the micro-batch* (TRL pads to the
  longest of the whole generation batch, which is never narrower), an attention mask, logits
  only for the completion positions (``logits_to_keep``), logprobs and entropy of the completion
  tokens (TRL's loss computes both), gradient accumulation and one AdamW step.
  ``--padded-layout right`` instead right-pads whole sequences to the longest in the micro-batch
  (narrower rows, logits everywhere).
Both use fp32, sdpa attention, no activation checkpointing, the same GRPO token-mean loss and
``token_logprobs``.

Length distributions (``--dists``; completion lengths, prompts uniform in 32-256 tokens):
- ``rl``: log-normal, median seq_len/6, sigma 0.8, capped at seq_len - prompt: right-skewed
  with a long tail, as reasoning rollouts are (many short answers, a few long ones);
- ``uniform``: uniform in [16, seq_len - prompt];
- ``short``: uniform in [1, 64] after prompts of 32-64 tokens (short RL answers, as in
  bench/vs_trl.py's 24M workload: many samples per packed row).
A summary of the drawn lengths is printed with the results.

Timing: every runner does one warm-up step, then each batch is stepped ``--repeats`` times by
every runner in turn and the fastest repeat of each (runner, batch) is kept (other load on a
shared machine only ever slows a step down). Throughput = real (non-padding) tokens of all
timed batches / the sum of those times, and the ratio = padded seconds / packed seconds for
the same samples. Per-batch ratios (min-max) are printed too. On a busy machine, time with
``--threads 1 --clock cpu`` (CPU seconds of one thread barely change with other load, while
two OpenMP threads sharing cores with other processes stall each other unpredictably).

GPU (``--gpu``, needs CUDA): a Qwen2.5-0.5B-shaped random model at seq_len 4096 (bf16 mixed
precision, fp32 master weights) through the packed path, reporting tokens/s and MFU =
(6 * matmul params + causal attention FLOPs) per token * tokens/s / peak (``--peak-tflops``,
default 989 for H100/H200 dense bf16).
Figures are wall-clock and machine-dependent: compare only runs on the same machine.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from telescope.core.packing import Packer
from telescope.core.testing import make_config
from telescope.core.trainer import RankBatch, TrainSample

#: name -> (hidden, layers, heads, kv_heads, intermediate, vocab, tied)
SHAPES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "2m": (192, 4, 4, 2, 512, 2048, True),
    "20m": (512, 6, 8, 4, 1408, 4096, True),
    "24m": (512, 8, 8, 4, 1408, 384, True),  # bench/vs_trl.py's 24M workload
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
}


def save_model(shape: str, directory: Path, seq_len: int) -> tuple[str, int]:
    """A random Qwen2 of ``shape`` saved with ``save_pretrained``; returns (path, parameter count)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        max_position_embeddings=max(seq_len, 4096),
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory / shape)
    return str(directory / shape), sum(p.numel() for p in model.parameters())


def completion_length(rng: random.Random, dist: str, prompt: int, seq_len: int) -> int:
    """One completion length for ``dist`` (see the module docstring), at least 16 tokens."""
    room = seq_len - prompt
    if dist == "rl":
        return int(min(room, max(16, rng.lognormvariate(math.log(seq_len / 6), 0.8))))
    if dist == "uniform":
        return rng.randint(16, room)
    if dist == "short":
        return rng.randint(1, min(64, room))
    raise ValueError(f"unknown length distribution {dist!r}; use 'rl' or 'uniform'")


def make_samples(
    n: int, seq_len: int, vocab: int, seed: int, prompt_range: tuple[int, int], dist: str = "rl"
) -> list[TrainSample]:
    """``n`` random samples: prompts uniform in ``prompt_range``, completions drawn from ``dist``."""
    rng, tokens = random.Random(seed), random.Random(-seed - 1)  # lengths do not depend on the vocab
    out = []
    for _ in range(n):
        p = rng.randint(*prompt_range)
        c = completion_length(rng, dist, p, seq_len)
        out.append(
            TrainSample(
                prompt_ids=[tokens.randrange(1, vocab) for _ in range(p)],
                completion_ids=[tokens.randrange(1, vocab) for _ in range(c)],
                inference_logprobs=[-tokens.uniform(4.0, 8.0) for _ in range(c)],
                advantage=tokens.uniform(-1.0, 1.0),
            )
        )
    return out


def describe_lengths(batches: list[list[TrainSample]], seq_len: int) -> str:
    """Percentiles of completion and total lengths over ``batches``."""
    comp = sorted(len(s.completion_ids) for b in batches for s in b)
    total = [s.length for b in batches for s in b]

    def pct(q: float) -> int:
        return comp[min(len(comp) - 1, int(q * len(comp)))]

    capped = sum(1 for b in batches for s in b if s.length >= seq_len - 16) / len(total)
    return (
        f"completion tokens p10 {pct(0.1)} p50 {pct(0.5)} p90 {pct(0.9)} max {comp[-1]}; "
        f"mean sample {sum(total) / len(total):.0f} tokens; {100 * capped:.0f}% within 16 of seq_len"
    )


def bench_config(model_dir: str, seq_len: int, mixed_precision: str | None) -> Any:
    return make_config(
        model=model_dir,
        model_dtype="float32",
        mixed_precision_dtype=mixed_precision,
        learning_rate=1e-5,
        lr_scheduler="none",
        seq_len=seq_len,
        pad_to_multiple_of=64,
        entropy_chunk_size=1024,
        algorithm="grpo",
    )


class PackedRunner:
    """Telescope's path: ``FSDPBackend.train_step`` on packed rows (one rank)."""

    def __init__(self, cfg: Any, checkpointing: bool, attn: str = "auto") -> None:
        from telescope.fsdp.backend import FSDPBackend
        from telescope.fsdp.options import FSDPBackendKwargs

        kwargs = FSDPBackendKwargs(gradient_checkpointing=checkpointing, attn_implementation=attn)
        self.backend = FSDPBackend(cfg, kwargs)
        self.backend.init()
        self.packer = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1)
        self.metrics: dict[str, float] = {}

    def step(self, samples: list[TrainSample]) -> tuple[int, int]:
        """One train step; returns (real tokens, slots)."""
        packed = self.packer.pack(samples)
        self.metrics = self.backend.train_step(RankBatch.from_packed(packed, 0))
        return packed.num_real_tokens, packed.num_slots


def trl_rows(chunk: list[TrainSample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's layout: [left-padded prompt | right-padded completion] per row.

    Returns (input_ids, attention_mask, completion ids [B, C], completion mask [B, C]).
    """
    width_p = max(len(s.prompt_ids) for s in chunk)
    width_c = max(len(s.completion_ids) for s in chunk)
    ids = torch.zeros(len(chunk), width_p + width_c, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, s in enumerate(chunk):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[r, width_p - p : width_p] = torch.tensor(s.prompt_ids)
        ids[r, width_p : width_p + c] = torch.tensor(s.completion_ids)
        attn[r, width_p - p : width_p + c] = 1
    return ids, attn, ids[:, width_p:], attn[:, width_p:].float()


def right_rows(chunk: list[TrainSample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole sequences right-padded to the longest; returns (ids, attention mask, targets, loss mask)."""
    width = max(s.length for s in chunk)
    ids = torch.zeros(len(chunk), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(chunk), width)
    for r, s in enumerate(chunk):
        ids[r, : s.length] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids))
        attn[r, : s.length] = 1
        mask[r, len(s.prompt_ids) : s.length] = 1
    return ids, attn, ids[:, 1:], mask[:, 1:]


def padded_step(
    model: Any, optimizer: Any, samples: list[TrainSample], batch_size: int, layout: str = "trl"
) -> tuple[int, int]:
    """One padded step (``layout`` trl or right, see the module docstring); returns (real tokens, slots)."""
    from telescope.core.algorithms.logprobs import token_entropy, token_logprobs

    n_loss = sum(len(s.completion_ids) for s in samples)
    real = slots = 0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        ids, attn, targets, mask = (trl_rows if layout == "trl" else right_rows)(chunk)
        keep = targets.shape[1] + 1 if layout == "trl" else 0  # 0: logits for every position
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep).logits
        logits = logits[:, :-1].reshape(-1, logits.shape[-1])
        lp = token_logprobs(logits, targets.reshape(-1), 1.0, 1024)
        token_entropy(logits.detach(), 1.0, 1024)  # TRL's loss computes entropies too
        adv = torch.tensor([s.advantage for s in chunk])[:, None]
        loss = -(lp.view_as(mask) * adv * mask).sum() / n_loss
        loss.backward()
        real += int(attn.sum())
        slots += ids.numel()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return real, slots


class PaddedRunner:
    """TRL-style baseline: unsharded HF model, one padded sample per row."""

    def __init__(self, model_dir: str, batch_size: int, layout: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.batch_size = batch_size
        self.layout = layout

    def step(self, samples: list[TrainSample]) -> tuple[int, int]:
        return padded_step(self.model, self.optimizer, samples, self.batch_size, self.layout)


def timed(
    runners: dict[str, Any], batches: list[list[TrainSample]], repeats: int = 1, clock: str = "wall"
) -> dict[str, tuple[list[float], int, int]]:
    """Warm every runner on ``batches[0]``, then step every later batch ``repeats`` times with
    each runner in turn, timed by ``clock`` (``wall``, or ``cpu``: this process's CPU seconds,
    which other processes' load barely changes when it runs one thread).

    Returns name -> (fastest seconds per timed batch, real tokens, slots of the timed batches).
    """
    now = time.process_time if clock == "cpu" else time.perf_counter
    for runner in runners.values():
        runner.step(batches[0])
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    real, slots = dict.fromkeys(runners, 0), dict.fromkeys(runners, 0)
    for samples in batches[1:]:
        best = dict.fromkeys(runners, math.inf)
        counts = dict.fromkeys(runners, (0, 0))
        for _ in range(repeats):
            for name, runner in runners.items():
                t0 = now()
                counts[name] = runner.step(samples)
                best[name] = min(best[name], now() - t0)
        for name in runners:
            seconds[name].append(best[name])
            real[name] += counts[name][0]
            slots[name] += counts[name][1]
    return {name: (seconds[name], real[name], slots[name]) for name in runners}


def work_model(shape: str, batches: list[list[TrainSample]], args: argparse.Namespace) -> tuple[float, float]:
    """(packed, padded) FLOPs of the timed batches as these kernels do the work: 6 per matmul
    parameter per row slot (lm_head only on the completion slots for the TRL layout), attention
    4 * hidden * n^2 per layer forward (x3 with backward), halved where it is causal. Packed rows
    run causal attention per sample; padded rows run masked (full-square) attention over the row.
    """
    hidden, layers, heads, kv, inter, vocab, _ = SHAPES[shape]
    body = layers * (2 * hidden * hidden + 2 * hidden * kv * hidden // heads + 3 * hidden * inter)
    head = vocab * hidden

    def attn(n: int, causal: bool) -> float:
        return 12 * layers * hidden * n * n * (0.5 if causal else 1.0)

    packer, packed, padded = Packer(args.seq_len, 64, 1), 0.0, 0.0
    for samples in batches:
        for row in packer.pack(samples).per_rank[0]:
            starts = [i for i, q in enumerate(row.position_ids) if q == 0] + [row.length]
            segments = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
            packed += 6 * (body + head) * row.length + sum(attn(n, True) for n in segments)
        for i in range(0, len(samples), args.padded_batch_size):
            chunk = samples[i : i + args.padded_batch_size]
            width_c = max(len(s.completion_ids) for s in chunk)
            if args.padded_layout == "trl":
                width = max(len(s.prompt_ids) for s in chunk) + width_c
                linear = body * width + head * (width_c + 1)
            else:
                width = max(s.length for s in chunk)
                linear = (body + head) * width
            padded += len(chunk) * (6 * linear + attn(width, False))
    return packed, padded


def packed_breakdown(metrics: dict[str, float]) -> str:
    """Share of the packed step spent in each timed phase (last timed step)."""
    step = metrics["timing_step_total"]
    phases = ("forward", "backward", "compute_entropy", "loss_computation", "optimizer")
    parts = [f"{p} {100 * metrics.get(f'timing_{p}_total', 0.0) / step:.0f}%" for p in phases]
    return "packed step: " + ", ".join(parts)


def cpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    print(
        f"CPU, {torch.get_num_threads()} threads, seq_len {args.seq_len}, {args.samples} samples/step, "
        f"{args.steps} timed steps x {args.repeats} repeats (fastest kept) after 1 warm-up, {args.clock} clock, "
        f"packed attention {args.packed_attn}, padded layout {args.padded_layout}, "
        f"padded batch size {args.padded_batch_size}"
    )
    for shape in args.models.split(","):
        model_dir, params = save_model(shape, workdir, args.seq_len)
        vocab = SHAPES[shape][5]
        for dist in args.dists.split(","):
            batches = [
                make_samples(
                    args.samples, args.seq_len, vocab, seed, (32, 64) if dist == "short" else (32, 256), dist
                )
                for seed in range(args.steps + 1)
            ]
            packed = PackedRunner(bench_config(model_dir, args.seq_len, None), False, args.packed_attn)
            runners = {
                "packed": packed,
                "padded": PaddedRunner(model_dir, args.padded_batch_size, args.padded_layout),
            }
            res = timed(runners, batches, args.repeats, args.clock)
            (t_pk, real, slots_pk), (t_pd, _, slots_pd) = res["packed"], res["padded"]
            per_batch = [d / p for p, d in zip(t_pk, t_pd, strict=True)]
            print(
                f"\n{shape} ({params / 1e6:.1f}M params), lengths '{dist}': "
                f"{describe_lengths(batches[1:], args.seq_len)}"
            )
            print(
                f"  packed {real / sum(t_pk):7.0f} tok/s (slot efficiency {real / slots_pk:.3f})  "
                f"padded {real / sum(t_pd):7.0f} tok/s (slot efficiency {real / slots_pd:.3f})  "
                f"ratio {sum(t_pd) / sum(t_pk):.2f}x (per batch {min(per_batch):.2f}-{max(per_batch):.2f}x)"
            )
            work_packed, work_padded = work_model(shape, batches[1:], args)
            print(
                f"  work model: packed {work_packed / 1e12:.2f} TFLOP, padded {work_padded / 1e12:.2f} TFLOP, "
                f"ratio {work_padded / work_packed:.2f}x; {packed_breakdown(packed.metrics)}",
                flush=True,
            )
            packed.backend.state = None  # free the model before the next runner pair


def gpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    shape, seq_len = "qwen2.5-0.5b", args.gpu_seq_len
    model_dir, params = save_model(shape, workdir, seq_len)
    hidden, layers, _, _, _, vocab, tied = SHAPES[shape]
    batches = [
        make_samples(args.gpu_samples, seq_len, vocab, seed, (64, 512)) for seed in range(args.steps + 1)
    ]
    cfg = bench_config(model_dir, seq_len, "bfloat16")
    runner = PackedRunner(cfg, args.gpu_checkpointing)
    seconds, tokens, _ = timed({"packed": runner}, batches, args.repeats)["packed"]
    tps = tokens / sum(seconds)
    metrics = runner.metrics
    # matmul FLOPs: 6 per parameter per token (embedding lookup excluded, lm_head included)
    dense = 6 * (params - vocab * hidden + (vocab * hidden if tied else 0))
    measured = [s for b in batches[1:] for s in b]
    # causal attention: QK^T and AV, 2 FLOPs per MAC, half the square, x3 for fwd + bwd
    attn = sum(3 * 2 * 2 * layers * hidden * s.length**2 / 2 for s in measured) / tokens
    mfu = (dense + attn) * tps / (args.peak_tflops * 1e12)
    print(
        f"GPU {torch.cuda.get_device_name()}: {shape} ({params / 1e6:.0f}M params) seq_len {seq_len}, "
        f"bf16 mixed precision, checkpointing={args.gpu_checkpointing}"
    )
    print(
        f"  tokens/s {tps:.0f}  MFU {100 * mfu:.1f}% (peak {args.peak_tflops} TFLOP/s)  "
        f"packing efficiency {metrics['packing/efficiency']:.3f}  peak memory "
        f"{metrics.get('memory/peak_allocated_gb', float('nan')):.1f} GiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="2m,20m", help=f"comma-separated of {', '.join(SHAPES)}")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=16, help="samples per RL step")
    parser.add_argument(
        "--dists", default="rl,uniform", help="completion length distributions: rl, uniform, short"
    )
    parser.add_argument("--steps", type=int, default=2, help="timed batches (after one warm-up step)")
    parser.add_argument("--repeats", type=int, default=2, help="steps per batch; the fastest is kept")
    parser.add_argument(
        "--padded-batch-size", type=int, default=8, help="rows per padded batch (TRL default 8)"
    )
    parser.add_argument(
        "--packed-attn",
        default="auto",
        choices=["auto", "packed_sdpa", "sdpa", "eager"],
        help="attention of the packed path (auto = packed_sdpa on CPU; sdpa = transformers' dense block mask)",
    )
    parser.add_argument(
        "--padded-layout", default="trl", choices=["trl", "right"], help="padded rows (see module docstring)"
    )
    parser.add_argument(
        "--group-max-len",
        type=int,
        default=None,
        help="packed_sdpa: longest sample batched with others (0: one SDPA call per sample, the old path)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core we may use)")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="cpu: process CPU seconds (use with --threads 1)",
    )
    parser.add_argument("--gpu", action="store_true", help="run the CUDA MFU benchmark instead")
    parser.add_argument("--gpu-seq-len", type=int, default=4096)
    parser.add_argument("--gpu-samples", type=int, default=128)
    parser.add_argument("--gpu-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if args.group_max_len is not None:
        from telescope.fsdp import attention

        attention.GROUP_MAX_LEN = args.group_max_len
    with tempfile.TemporaryDirectory() as tmp:
        if args.gpu:
            if not torch.cuda.is_available():
                raise SystemExit("--gpu needs CUDA; none is available here")
            gpu_bench(args, Path(tmp))
        else:
            cpu_bench(args, Path(tmp))


if __name__ == "__main__":
    main()
