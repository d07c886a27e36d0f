"""GPU weight-sync check for scripts/gpu-check.sh: a real two-process sync, verified, timed, plus the
cost of verification (sum64 on the device vs a host copy + xxh3).

- Two or more GPUs: NCCL between cuda:0 (sender) and cuda:1 (receiver).
- One GPU: NCCL cannot put two ranks on one device, so the sender's tensors start on cuda:0 and travel
  over gloo (the CUDA staging path) to a CPU receiver; the NCCL row says it was not run.

Prints one Markdown table; exit code 1 when a sync's fingerprints or tensors differ.

NOT RUN YET: written without a GPU (issue #32); scripts/gpu-check.sh runs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from telescope.core.weights import GroupSpec, WeightSyncSettings
from telescope.core.weights.fingerprint import digest, fingerprint
from telescope.core.weights.group import WeightSyncGroup, free_port
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.sender import WeightSender


def tensors(total_mb: int, device: str) -> list[tuple[str, torch.Tensor]]:
    """A Qwen-like mix: large bf16 matrices, small norms, ~``total_mb`` MiB in all."""
    gen = torch.Generator().manual_seed(0)
    out, size, i = [], 0, 0
    while size < total_mb << 20:
        t = torch.randn(1024, 4096, generator=gen).to(torch.bfloat16)
        out += [(f"layers.{i}.w", t), (f"layers.{i}.norm", torch.randn(4096, generator=gen))]
        size += t.numel() * 2 + 4096 * 4
        i += 1
    return [(n, t.to(device)) for n, t in out]


def worker(rank: int, port: int, backend: str, total_mb: int, reps: int, source: str, queue: Any) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    spec = GroupSpec(host="127.0.0.1", port=port, world_size=2, backend=backend, timeout_s=300)
    group = WeightSyncGroup(spec, rank)
    if rank == 0:
        sender = WeightSender(group, WeightSyncSettings())
        named = tensors(total_mb, source)
        for version in range(1, reps + 1):
            report = sender.send(iter(named), version)
            queue.put(("sent", version, report.seconds, report.num_bytes, report.fingerprints))
    else:
        receiver = WeightReceiver(group, verify=True)
        expected = dict(tensors(total_mb, "cpu"))
        for version in range(1, reps + 1):
            got = {n: t.detach().cpu().clone() for n, t in receiver.receive(expect_version=version)}
            equal = got.keys() == expected.keys() and all(torch.equal(got[n], expected[n]) for n in got)
            last = receiver.last_sync
            queue.put(("received", version, equal, last.received_fingerprints if last else None))


def run_sync(backend: str, total_mb: int, reps: int, source: str = "cuda:0") -> tuple[list[float], int, bool]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, port, backend, total_mb, reps, source, queue)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    sent: dict[int, Any] = {}
    received: dict[int, Any] = {}
    for _ in range(2 * reps):
        kind, version, *rest = queue.get(timeout=600)
        (sent if kind == "sent" else received)[version] = rest
    for p in procs:
        p.join(timeout=60)
    ok = all(received[v][0] and received[v][1] == sent[v][2] for v in sent)
    return [sent[v][0] for v in sorted(sent)], sent[1][1], ok


def verify_cost(total_mb: int) -> tuple[float, float]:
    """Seconds to fingerprint ``total_mb`` MiB of CUDA tensors: sum64 on the device, copy + xxh3."""
    named = tensors(total_mb, "cuda:0")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _, t in named:
        digest(t, "sum64")
    device_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _, t in named:
        fingerprint(t.cpu())
    host_s = time.perf_counter() - t0
    return device_s, host_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="MiB per sync")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--cpu-rehearsal", action="store_true", help="CPU only: the sync over gloo, no timing claims"
    )
    args = parser.parse_args()
    if args.cpu_rehearsal:
        _, nbytes, ok = run_sync("gloo", args.mb, args.reps, source="cpu")
        print(f"| CPU rehearsal sync, {nbytes / 2**20:.0f} MiB | {'verified' if ok else 'MISMATCH'} |")
        return 0 if ok else 1
    if not torch.cuda.is_available():
        print("gpu_sync: no CUDA device", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    print("| check | result |\n|---|---|")
    failed = False
    backend = "nccl" if gpus >= 2 else "gloo"
    seconds, nbytes, ok = run_sync(backend, args.mb, args.reps)
    best = min(seconds)
    path = (
        "NCCL cuda:0 -> cuda:1" if backend == "nccl" else "gloo, sender on cuda:0 (staged), receiver on CPU"
    )
    print(
        f"| sync ({path}), {nbytes / 2**20:.0f} MiB | {'verified' if ok else 'MISMATCH'}; "
        f"best {best:.3f} s = {nbytes / best / 1e9:.2f} GB/s over {args.reps} syncs |"
    )
    failed |= not ok
    if backend == "gloo":
        print("| NCCL sync | not run: NCCL needs two GPUs (one rank per device) |")
    device_s, host_s = verify_cost(args.mb)
    print(
        f"| verify {args.mb} MiB on cuda:0 | sum64 on the device {device_s:.3f} s; "
        f"copy to host + xxh3 {host_s:.3f} s |"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
