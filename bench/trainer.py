"""Trainer throughput: packed rows (Telescope's FSDP backend) vs padded one-sample-per-row.

Run: ``.venv/bin/python bench/trainer.py [--models 2m,20m] [--samples 32] [--steps 2]``.

CPU (default): for a ~2M and a ~20M parameter random Qwen2 model, one RL step over the same
mixed-length samples (prompts 32-256 tokens, heavy-tailed completions, each <= seq_len
2048) is timed two ways:
- packed: ``FSDPBackend.train_step`` on first-fit-decreasing rows of <= seq_len tokens with
  restarting position ids (1 rank, gloo);
- padded: the way TRL's GRPOTrainer batches: ``--padded-batch-size`` samples per row batch,
  each sample its own row, right-padded to the longest in the batch, with an attention mask,
  gradient accumulation over the batches and one AdamW step.
Both use fp32, sdpa attention, no activation checkpointing, the same GRPO token-mean loss and
``token_logprobs``. Throughput counts real (non-padding) tokens per second of wall time; the
first step of each is a warm-up and is not timed; the best of ``--steps`` timed steps (packed
and padded alternating on the same batches) is reported, since other load on a shared
machine only ever slows a step down.

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
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
}


def save_model(shape: str, directory: Path, seq_len: int) -> tuple[str, int]:
    """A random Qwen2 of ``shape`` saved with ``save_pretrained``; returns (path, parameter count)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=max(seq_len, 4096),
        tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory / shape)
    return str(directory / shape), sum(p.numel() for p in model.parameters())


def make_samples(
    n: int, seq_len: int, vocab: int, seed: int, prompt_range: tuple[int, int]
) -> list[TrainSample]:
    """Mixed lengths as in RL rollouts: uniform prompts, log-normal completions (median ~seq_len/6)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.randint(*prompt_range)
        c = int(min(seq_len - p, max(16, rng.lognormvariate(math.log(seq_len / 6), 0.8))))
        out.append(
            TrainSample(
                prompt_ids=[rng.randrange(1, vocab) for _ in range(p)],
                completion_ids=[rng.randrange(1, vocab) for _ in range(c)],
                inference_logprobs=[-rng.uniform(4.0, 8.0) for _ in range(c)],
                advantage=rng.uniform(-1.0, 1.0),
            )
        )
    return out


def bench_config(model_dir: str, seq_len: int, mixed_precision: str | None) -> Any:
    return make_config(
        model=model_dir, model_dtype="float32", mixed_precision_dtype=mixed_precision, learning_rate=1e-5,
        lr_scheduler="none", seq_len=seq_len, pad_to_multiple_of=64, entropy_chunk_size=1024, algorithm="grpo",
    )  # fmt: skip


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


def padded_step(model: Any, optimizer: Any, samples: list[TrainSample], batch_size: int) -> tuple[int, int]:
    """One TRL-style step: right-padded rows with an attention mask; returns (real tokens, slots)."""
    from telescope.core.algorithms.logprobs import token_logprobs

    chunks = [samples[i : i + batch_size] for i in range(0, len(samples), batch_size)]
    n_loss = sum(len(s.completion_ids) for s in samples)
    real = slots = 0
    for chunk in chunks:
        width = max(s.length for s in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attn = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width)
        adv = torch.zeros(len(chunk), width)
        for r, s in enumerate(chunk):
            seq = list(s.prompt_ids) + list(s.completion_ids)
            ids[r, : len(seq)] = torch.tensor(seq)
            attn[r, : len(seq)] = 1
            mask[r, len(s.prompt_ids) : len(seq)] = 1
            adv[r, :] = s.advantage
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        lp = token_logprobs(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), 1.0, 1024)
        loss = -(lp * adv[:, 1:].reshape(-1) * mask[:, 1:].reshape(-1)).sum() / n_loss
        loss.backward()
        real += int(attn.sum())
        slots += ids.numel()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return real, slots


class PaddedRunner:
    """TRL-style baseline: unsharded HF model, one right-padded sample per row."""

    def __init__(self, model_dir: str, batch_size: int) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.batch_size = batch_size

    def step(self, samples: list[TrainSample]) -> tuple[int, int]:
        return padded_step(self.model, self.optimizer, samples, self.batch_size)


def timed(runners: dict[str, Any], batches: list[list[TrainSample]]) -> dict[str, tuple[float, float]]:
    """Warm every runner on ``batches[0]``, then alternate them on each later batch.

    Returns name -> (best real tokens per second over the timed steps, real tokens / slots).
    Best-of rather than mean: on a shared machine other load only ever slows a step down.
    """
    for runner in runners.values():
        runner.step(batches[0])
    best = dict.fromkeys(runners, 0.0)
    real_total, slot_total = dict.fromkeys(runners, 0), dict.fromkeys(runners, 0)
    for samples in batches[1:]:
        for name, runner in runners.items():
            t0 = time.perf_counter()
            real, slots = runner.step(samples)
            best[name] = max(best[name], real / (time.perf_counter() - t0))
            real_total[name] += real
            slot_total[name] += slots
    return {name: (best[name], real_total[name] / slot_total[name]) for name in runners}


def cpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    print(f"CPU, {torch.get_num_threads()} threads, seq_len {args.seq_len}, {args.samples} samples/step, "
          f"packed attention {args.packed_attn}, best of "
          f"{args.steps} timed steps after 1 warm-up, padded batch size {args.padded_batch_size}")  # fmt: skip
    print(f"{'model':>6} {'params':>8} {'packed tok/s':>13} {'padded tok/s':>13} {'ratio':>6} "
          f"{'pack eff':>8} {'pad eff':>8}")  # fmt: skip
    for shape in args.models.split(","):
        model_dir, params = save_model(shape, workdir, args.seq_len)
        vocab = SHAPES[shape][5]
        batches = [
            make_samples(args.samples, args.seq_len, vocab, seed, (32, 256)) for seed in range(args.steps + 1)
        ]
        runners = {
            "packed": PackedRunner(bench_config(model_dir, args.seq_len, None), False, args.packed_attn),
            "padded": PaddedRunner(model_dir, args.padded_batch_size),
        }
        res = timed(runners, batches)
        (packed_tps, pack_eff), (padded_tps, pad_eff) = res["packed"], res["padded"]
        print(f"{shape:>6} {params / 1e6:>7.1f}M {packed_tps:>13.0f} {padded_tps:>13.0f} "
              f"{packed_tps / padded_tps:>5.2f}x {pack_eff:>8.3f} {pad_eff:>8.3f}", flush=True)  # fmt: skip


def gpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    shape, seq_len = "qwen2.5-0.5b", args.gpu_seq_len
    model_dir, params = save_model(shape, workdir, seq_len)
    hidden, layers, _, _, _, vocab, tied = SHAPES[shape]
    batches = [
        make_samples(args.gpu_samples, seq_len, vocab, seed, (64, 512)) for seed in range(args.steps + 1)
    ]
    cfg = bench_config(model_dir, seq_len, "bfloat16")
    runner = PackedRunner(cfg, args.gpu_checkpointing)
    tps, _ = timed({"packed": runner}, batches)["packed"]
    metrics = runner.metrics
    # matmul FLOPs: 6 per parameter per token (embedding lookup excluded, lm_head included)
    dense = 6 * (params - vocab * hidden + (vocab * hidden if tied else 0))
    measured = [s for b in batches[1:] for s in b]
    tokens = sum(s.length for s in measured)
    # causal attention: QK^T and AV, 2 FLOPs per MAC, half the square, x3 for fwd + bwd
    attn = sum(3 * 2 * 2 * layers * hidden * s.length**2 / 2 for s in measured) / tokens
    mfu = (dense + attn) * tps / (args.peak_tflops * 1e12)
    print(f"GPU {torch.cuda.get_device_name()}: {shape} ({params / 1e6:.0f}M params) seq_len {seq_len}, "
          f"bf16 mixed precision, checkpointing={args.gpu_checkpointing}")  # fmt: skip
    print(f"  tokens/s {tps:.0f}  MFU {100 * mfu:.1f}% (peak {args.peak_tflops} TFLOP/s)  "
          f"packing efficiency {metrics['packing/efficiency']:.3f}  peak memory "
          f"{metrics.get('memory/peak_allocated_gb', float('nan')):.1f} GiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="2m,20m", help=f"comma-separated of {', '.join(SHAPES)}")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=16, help="samples per RL step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    parser.add_argument(
        "--padded-batch-size", type=int, default=8, help="rows per padded batch (TRL default 8)"
    )
    parser.add_argument(
        "--packed-attn",
        default="auto",
        choices=["auto", "packed_sdpa", "sdpa", "eager"],
        help="attention of the packed path (auto = packed_sdpa on CPU; sdpa = transformers' dense block mask)",
    )
    parser.add_argument("--gpu", action="store_true", help="run the CUDA MFU benchmark instead")
    parser.add_argument("--gpu-seq-len", type=int, default=4096)
    parser.add_argument("--gpu-samples", type=int, default=128)
    parser.add_argument("--gpu-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory() as tmp:
        if args.gpu:
            if not torch.cuda.is_available():
                raise SystemExit("--gpu needs CUDA; none is available here")
            gpu_bench(args, Path(tmp))
        else:
            cpu_bench(args, Path(tmp))


if __name__ == "__main__":
    main()
