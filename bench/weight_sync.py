"""Weight-sync throughput over gloo: 1 sender -> 2 receivers on 127.0.0.1, both modes, next to a raw
``broadcast`` of the same number of bytes.

    .venv/bin/python bench/weight_sync.py [--sizes 2M,20M,100M] [--reps 9] [--bucket-mb 256] [--direct-mb 4,1e6]

Models are Qwen2-architecture state dicts (fp32) of about 2M, 20M and 100M parameters. Each sync
is timed on the sender from a barrier before it to a barrier after every receiver has finished
(receive, metadata, fingerprints when verifying). The raw broadcast and every sync variant take
turns within each round, and "% raw" is the median over rounds of raw/sync measured in the same
round: on a shared machine the load drifts between rounds, so only side-by-side ratios mean
anything. ``--direct-mb`` adds flattened_bucket variants (no verification) with another
threshold for sending a tensor directly instead of bucketing it (1e6: bucket everything).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from telescope.core.weights import GroupSpec, WeightSyncSettings
from telescope.core.weights.group import WeightSyncGroup, free_port
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.sender import WeightSender

# name -> (hidden, layers, intermediate, vocab)
SIZES = {"2M": (256, 4, 512, 384), "20M": (512, 4, 2048, 8000), "100M": (768, 10, 3072, 16000)}
# (mode, verify, direct threshold in MiB or None for the default)
MODES: list[tuple[str, bool, float | None]] = [
    ("flattened_bucket", False, None),
    ("flattened_bucket", True, None),
    ("per_tensor", False, None),
    ("per_tensor", True, None),
]


def state_dict(size: str) -> dict[str, torch.Tensor]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, inter, vocab = SIZES[size]
    config = Qwen2Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        vocab_size=vocab,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    return {n: p.detach() for n, p in model.named_parameters()}


def run_rank(
    rank: int, ports: list[int], sizes: list[str], reps: int, bucket_mb: int, modes: list, out: dict
) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    # One group per variant, as in a run (one sender with fixed settings per group): every member
    # of a group predicts the next sync's layout from that group's previous sync.
    groups = [
        WeightSyncGroup(GroupSpec(host="127.0.0.1", port=port, world_size=3, timeout_s=600), rank)
        for port in ports
    ]
    control = groups[0]
    for size in sizes:
        tensors = state_dict(size) if rank == 0 else {}
        total = torch.tensor([sum(t.numel() * t.element_size() for t in tensors.values())], dtype=torch.int64)
        control.broadcast_now(total)
        nbytes = int(total.item())
        raw = torch.ones(nbytes, dtype=torch.uint8) if rank == 0 else torch.empty(nbytes, dtype=torch.uint8)
        # The same tensors broadcast one after the other, unframed: the floor of per_tensor mode,
        # which pays gloo's fixed cost per broadcast (~0.4-0.8 ms here) once per tensor.
        each = [t.reshape(-1).view(torch.uint8) for t in tensors.values()] if rank == 0 else []
        sizes_each = torch.tensor([len(each)] + [b.numel() for b in each], dtype=torch.int64)
        count = torch.zeros(1, dtype=torch.int64) if rank else sizes_each[:1].clone()
        control.broadcast_now(count)
        sizes_each = sizes_each if rank == 0 else torch.zeros(int(count.item()) + 1, dtype=torch.int64)
        control.broadcast_now(sizes_each)
        each = each or [torch.empty(int(n), dtype=torch.uint8) for n in sizes_each[1:].tolist()]
        steps: dict[Any, Any] = {
            "raw": lambda r=raw: control.broadcast_now(r),
            "raw_each": lambda e=each: [control.broadcast_now(b) for b in e],
        }
        for (mode, verify, direct), group in zip(modes, groups[1:], strict=True):
            settings = WeightSyncSettings(
                mode=mode, bucket_mb=bucket_mb, verify=verify, direct_tensor_mb=direct
            )
            if rank == 0:
                sender = WeightSender(group, settings)
                steps[(mode, verify, direct)] = lambda s=sender, t=tensors: s.send(iter(t.items()), 1)
            else:
                receiver = WeightReceiver(group, verify=verify)
                steps[(mode, verify, direct)] = lambda r=receiver: r.receive_all()
        rounds = _timed_rounds(control, reps, steps)
        if rank == 0:
            params = sum(t.numel() for t in tensors.values())
            out[size] = (params, nbytes, len(tensors), rounds)
        del raw, tensors


def _timed_rounds(group: WeightSyncGroup, reps: int, steps: dict[Any, Any]) -> list[dict[Any, float]]:
    """Seconds of every step in every round (the steps take turns within a round)."""
    rounds = []
    for i in range(reps + 1):  # the first round warms up connections, buffers and the metadata cache
        times = {}
        for key, step in steps.items():
            group.barrier()
            start = time.perf_counter()
            step()
            group.barrier()
            times[key] = time.perf_counter() - start
        if i:
            rounds.append(times)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2M,20M,100M")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument(
        "--direct-mb", default="", help="extra flattened_bucket direct thresholds, e.g. 4,1e6"
    )
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    modes = MODES + [("flattened_bucket", False, float(v)) for v in args.direct_mb.split(",") if v]
    manager = mp.Manager()
    out = manager.dict()
    mp.start_processes(
        run_rank,
        args=([free_port() for _ in range(len(modes) + 1)], sizes, args.reps, args.bucket_mb, modes, out),
        nprocs=3,
        start_method="spawn",
    )
    print(f"weight sync over gloo, 1 sender -> 2 receivers, bucket {args.bucket_mb} MB, {args.reps} rounds")
    print(
        "% raw: vs one raw broadcast of all the bytes; % each: vs raw broadcasts of the same tensors one by one"
    )
    print(
        f"{'model':>6} {'params':>8} {'MB':>7} {'tensors':>7}  {'mode':<17} {'verify':<6} {'direct':>6}"
        f" {'ms':>8} {'GB/s':>6} {'% raw':>6} {'% each':>6}"
    )
    for size in sizes:
        params, nbytes, count, rounds = out[size]
        head = f"{size:>6} {params / 1e6:>7.1f}M {nbytes / 1e6:>7.1f} {count:>7}"
        for key in ["raw", "raw_each", *modes]:
            seconds = statistics.median(r[key] for r in rounds)
            ratio = statistics.median(r["raw"] / r[key] for r in rounds)
            ratio_each = statistics.median(r["raw_each"] / r[key] for r in rounds)
            if isinstance(key, str):
                mode, verify, direct = ("raw broadcast" if key == "raw" else "raw per tensor"), "-", "-"
            else:
                mode, verify, direct = key[0], str(key[1]), "4" if key[2] is None else f"{key[2]:g}"
            print(
                f"{head}  {mode:<17} {verify:<6} {direct:>6} {seconds * 1e3:>8.1f}"
                f" {nbytes / seconds / 1e9:>6.2f} {100 * ratio:>5.0f}% {100 * ratio_each:>5.0f}%"
            )


if __name__ == "__main__":
    main()
