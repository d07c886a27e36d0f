"""Checkpoint save/load time and size, with and without training state, plus HF conversion.

Run: ``.venv/bin/python bench/checkpoint.py [--reps 3] [--threads 2] [--keep DIR]``.

A ~20M parameter random Qwen2-shaped model (hidden 512, 4 layers, 8 heads / 2 KV heads,
intermediate 1536, vocab 16384, tied embeddings, fp32) in the FSDP backend (world size 1,
gloo, CPU) takes one AdamW step so the optimizer has state, then for each mode:
- save: ``CheckpointManager.begin`` + ``FSDPBackend.save_checkpoint`` + ``commit`` (fsync of
  every file, atomic rename), i.e. what a training run pays per checkpoint;
- load: ``FSDPBackend.load_checkpoint`` into the live trainer (what a resume pays);
- size: bytes on disk of the committed folder.
Then ``convert_checkpoint`` (DCP -> ``model.safetensors`` + hf_meta) of the full checkpoint.
Each figure is the median of ``--reps`` repetitions. Wall-clock, machine-dependent; the disk
is whatever backs the temp folder (or ``--keep``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from telescope.core.checkpoint import CheckpointManager, convert_checkpoint
from telescope.core.packing import Packer
from telescope.core.testing import make_config
from telescope.core.trainer import RankBatch, TrainSample


def build_model(directory: Path) -> int:
    """Save the random ~20M model; returns its parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=16384,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def one_step(backend: Any, cfg: Any) -> None:
    gen = torch.Generator().manual_seed(1)
    samples = [
        TrainSample(
            prompt_ids=torch.randint(1, 16384, (32,), generator=gen).tolist(),
            completion_ids=torch.randint(1, 16384, (96,), generator=gen).tolist(),
            inference_logprobs=[-4.0] * 96,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(4)
    ]
    packed = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1).pack(samples)
    backend.train_step(RankBatch.from_packed(packed, 0, 0))


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_mode(backend: Any, root: Path, training_state: bool, reps: int) -> dict[str, float]:
    mgr = CheckpointManager(root / ("full" if training_state else "weights_only"), keep_last=1)
    saves, loads = [], []
    for rep in range(reps):
        step = rep + 1

        def save(step: int = step) -> None:
            partial = mgr.begin(step)
            backend.save_checkpoint(str(partial), training_state=training_state)
            mgr.commit(partial, step)

        saves.append(timed(save))
        loads.append(timed(lambda: backend.load_checkpoint(str(mgr.path(mgr.latest() or 0)))))
    path = mgr.path(mgr.latest() or 0)
    return {
        "save_s": statistics.median(saves),
        "load_s": statistics.median(loads),
        "size_mb": folder_bytes(path) / 1e6,
        "path": str(path),
    }  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (median is printed)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--keep", type=Path, default=None, help="write here instead of a temp folder")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.pop("WORLD_SIZE", None)  # one-rank gloo group on a free port
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        params = build_model(root / "model")
        from telescope.fsdp.backend import FSDPBackend
        from telescope.fsdp.options import FSDPBackendKwargs

        cfg = make_config(
            model=str(root / "model"),
            model_dtype="float32",
            mixed_precision_dtype=None,
            seq_len=512,
            pad_to_multiple_of=8,
            number_of_steps=10,
        )
        backend = FSDPBackend(cfg, FSDPBackendKwargs(device="cpu", gradient_checkpointing=False))
        backend.init()
        one_step(backend, cfg)
        print(
            f"model: Qwen2-shaped, {params / 1e6:.1f}M parameters, fp32, FSDP world size 1 (gloo, CPU), "
            f"{args.threads} threads, median of {args.reps}"
        )
        print(f"{'mode':<26}{'save s':>9}{'load s':>9}{'size MB':>10}")
        results = {}
        for training_state in (True, False):
            r = bench_mode(backend, root / "ckpts", training_state, args.reps)
            results[training_state] = r
            label = "with training state" if training_state else "weights only"
            print(f"{label:<26}{r['save_s']:>9.3f}{r['load_s']:>9.3f}{r['size_mb']:>10.1f}")
        convert_times = []
        for rep in range(args.reps):
            out = root / "hf" / f"rep{rep}"
            convert_times.append(timed(lambda out=out: convert_checkpoint(results[True]["path"], out)))
        size = folder_bytes(root / "hf" / "rep0") / 1e6
        print(f"{'convert to HF':<26}{statistics.median(convert_times):>9.3f}{'':>9}{size:>10.1f}")
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
