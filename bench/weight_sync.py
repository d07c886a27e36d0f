"""Weight-sync throughput over gloo: 1 sender -> 2 receivers on 127.0.0.1, both modes, next to a raw
``broadcast`` of the same number of bytes.

    .venv/bin/python bench/weight_sync.py [--sizes 2M,20M,100M] [--reps 3] [--bucket-mb 256]

Models are Qwen2-architecture state dicts (fp32) of about 2M, 20M and 100M parameters. Each
figure is the median of ``--reps`` syncs, timed on the sender from a barrier before the sync to
a barrier after every receiver has finished (receive, metadata, fingerprints when verifying).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.multiprocessing as mp

from telescope.core.weights import GroupSpec, WeightSyncSettings
from telescope.core.weights.group import WeightSyncGroup, free_port
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.sender import WeightSender

# name -> (hidden, layers, intermediate, vocab)
SIZES = {"2M": (256, 4, 512, 384), "20M": (512, 4, 2048, 8000), "100M": (768, 10, 3072, 16000)}
MODES = [("flattened_bucket", False), ("flattened_bucket", True), ("per_tensor", False), ("per_tensor", True)]


def state_dict(size: str) -> dict[str, torch.Tensor]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, inter, vocab = SIZES[size]
    config = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    return {n: p.detach() for n, p in model.named_parameters()}


def run_rank(rank: int, port: int, sizes: list[str], reps: int, bucket_mb: int, out: dict) -> None:
    torch.set_num_threads(1)
    group = WeightSyncGroup(GroupSpec(host="127.0.0.1", port=port, world_size=3, timeout_s=600), rank)
    for size in sizes:
        tensors = state_dict(size) if rank == 0 else {}
        total = torch.tensor([sum(t.numel() * t.element_size() for t in tensors.values())], dtype=torch.int64)
        group.broadcast_now(total)
        nbytes = int(total.item())
        raw = torch.ones(nbytes, dtype=torch.uint8) if rank == 0 else torch.empty(nbytes, dtype=torch.uint8)
        times = {"raw": _timed(group, reps, lambda r=raw: group.broadcast_now(r))}
        for mode, verify in MODES:
            settings = WeightSyncSettings(mode=mode, bucket_mb=bucket_mb, verify=verify)
            if rank == 0:
                sender = WeightSender(group, settings)
                step = lambda s=sender, t=tensors: s.send(iter(t.items()), 1)  # noqa: E731
            else:
                receiver = WeightReceiver(group, verify=verify)
                step = lambda r=receiver: r.receive_all()  # noqa: E731
            times[(mode, verify)] = _timed(group, reps, step)
        if rank == 0:
            params = sum(t.numel() for t in tensors.values())
            out[size] = (params, nbytes, len(tensors), times)
        del raw, tensors


def _timed(group: WeightSyncGroup, reps: int, step) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for i in range(reps + 1):  # the first run warms up the connections and the metadata cache
        group.barrier()
        start = time.perf_counter()
        step()
        group.barrier()
        if i:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2M,20M,100M")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=256)
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    manager = mp.Manager()
    out = manager.dict()
    mp.start_processes(
        run_rank, args=(free_port(), sizes, args.reps, args.bucket_mb, out), nprocs=3, start_method="spawn"
    )
    print(
        f"weight sync over gloo, 1 sender -> 2 receivers, bucket {args.bucket_mb} MB, median of {args.reps}"
    )
    print(
        f"{'model':>6} {'params':>8} {'MB':>7} {'tensors':>7}  {'mode':<17} {'verify':<6} {'ms':>8} {'GB/s':>6} {'% raw':>6}"
    )
    for size in sizes:
        params, nbytes, count, times = out[size]
        raw = times["raw"]
        head = f"{size:>6} {params / 1e6:>7.1f}M {nbytes / 1e6:>7.1f} {count:>7}"
        print(
            f"{head}  {'raw broadcast':<17} {'-':<6} {raw * 1e3:>8.1f} {nbytes / raw / 1e9:>6.2f} {100:>5.0f}%"
        )
        for mode, verify in MODES:
            t = times[(mode, verify)]
            print(
                f"{head}  {mode:<17} {str(verify):<6} {t * 1e3:>8.1f} {nbytes / t / 1e9:>6.2f} {100 * raw / t:>5.0f}%"
            )


if __name__ == "__main__":
    main()
