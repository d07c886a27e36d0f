"""Helpers for the checkpoint tests: build an FSDP backend, train steps, read weights."""

from __future__ import annotations

from typing import Any

from fsdp_helpers import make_samples, spawned_rank, tiny_config

__all__ = ["make_backend", "resume_config", "run_steps", "weights"]


def resume_config(model_dir: str, **overrides: Any) -> Any:
    """fp32, AdamW-friendly LR, warmup + cosine over 6 steps (the schedule resume must restore)."""
    base: dict[str, Any] = {
        "lr_scheduler": "cosine",
        "warmup_steps": 2,
        "number_of_steps": 6,
        "learning_rate": 5e-3,
        "min_lr_ratio": 0.1,
    }
    base.update(overrides)
    return tiny_config(model_dir, **base)


def make_backend(cfg: Any, **kwargs: Any) -> Any:
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    backend = FSDPBackend(
        cfg, FSDPBackendKwargs(**{"gradient_checkpointing": False, "device": "cpu", **kwargs})
    )
    backend.init()
    return backend


def run_steps(backend: Any, cfg: Any, steps: range) -> list[dict[str, float]]:
    """Train the given 0-indexed steps; the batch of step ``i`` depends only on ``i``."""
    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch

    packer = Packer(
        cfg.seq_len, cfg.pad_to_multiple_of, backend.dp_world_size, num_minibatches=cfg.number_of_minibatches
    )
    out = []
    for i in steps:
        packed = packer.pack(make_samples(6, seed=100 + i))
        out.append(backend.train_step(RankBatch.from_packed(packed, backend.dp_rank, i)))
    return out


def weights(backend: Any) -> dict[str, Any]:
    return {k: v.clone() for k, v in backend.iter_weights_for_inference()}


def two_rank_resume_worker(rank: int, world_size: int, port: int, cfg_json: str, out_dir: str) -> None:
    """``torch.multiprocessing.spawn`` target: train 2 steps, save through the manager (rank 0
    names and commits the folder), train 2 more, then resume a fresh backend and redo them."""
    import os

    import torch
    import torch.distributed as dist

    from telescope.core.checkpoint import CheckpointManager

    cfg = spawned_rank(rank, world_size, port, cfg_json)
    backend = make_backend(cfg)
    first = run_steps(backend, cfg, range(0, 2))
    torch.manual_seed(1000 + rank)  # distinct per-rank RNG streams
    mgr = CheckpointManager(f"{out_dir}/ckpts")
    partial = [str(mgr.begin(2)) if rank == 0 else ""]
    dist.broadcast_object_list(partial, src=0)
    backend.save_checkpoint(partial[0])
    if rank == 0:
        mgr.commit(partial[0], 2)
    dist.barrier()
    rand_after_save = torch.rand(3)
    saved = weights(backend)
    rest = run_steps(backend, cfg, range(2, 4))
    final = weights(backend)
    resumed = make_backend(cfg)  # init() reseeds: the RNG must come from the checkpoint
    info = resumed.load_checkpoint(str(mgr.path(2)))
    rand_after_load = torch.rand(3)
    again = run_steps(resumed, cfg, range(2, 4))
    result = {
        "metrics": first + rest,
        "again": again,
        "final": final,
        "final_again": weights(resumed),
        "saved": saved,
        "info": info,
        "rand_save": rand_after_save,
        "rand_load": rand_after_load,
    }
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    dist.barrier()  # every rank is past its last collective and has written its results
    # End without interpreter teardown: a spawned rank's exit intermittently aborts in torch's C++
    # threads ("terminate called without an active exception", SIGABRT) after all work is done.
    os._exit(0)
