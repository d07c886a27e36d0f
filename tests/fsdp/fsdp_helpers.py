"""Shared helpers for the FSDP tests: a tiny random Qwen2 saved locally, samples, configs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from telescope.core.trainer import TrainSample

VOCAB = 96


def save_tiny_qwen2(directory: Path, *, tied: bool = True, seed: int = 0, hidden: int = 64) -> str:
    """A 2-layer random Qwen2 written with ``save_pretrained`` (loaded back via ``from_pretrained``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
    )
    model = Qwen2ForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return str(directory)


def make_samples(n: int, *, seed: int = 0, min_len: int = 4, max_len: int = 24) -> list[TrainSample]:
    """Random samples with varied prompt/completion lengths, logprobs and advantages."""
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        p, c = rng.randint(2, 8), rng.randint(min_len, max_len)
        samples.append(
            TrainSample(
                prompt_ids=[rng.randrange(1, VOCAB) for _ in range(p)],
                completion_ids=[rng.randrange(1, VOCAB) for _ in range(c)],
                inference_logprobs=[-rng.uniform(3.0, 6.0) for _ in range(c)],
                advantage=rng.uniform(-1.5, 1.5),
            )
        )
    return samples


def tiny_config(model_dir: str, **overrides: Any) -> Any:
    """A run config for the tiny model: fp32, no mixed precision, exact-comparison friendly."""
    from telescope.core.testing import make_config

    base: dict[str, Any] = {
        "model": model_dir,
        "model_dtype": "float32",
        "mixed_precision_dtype": None,
        "learning_rate": 1e-2,
        "lr_scheduler": "none",
        "seq_len": 64,
        "pad_to_multiple_of": 8,
        "entropy_chunk_size": 16,
        "algorithm": "grpo",
        "number_of_steps": 10,
    }
    base.update(overrides)
    return make_config(**base)


def backend_for(cfg: Any, **kwargs: Any) -> Any:
    """An initialised one-rank ``FSDPBackend``; ``backend.info`` is what ``init()`` returned."""
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    backend = FSDPBackend(cfg, FSDPBackendKwargs(**kwargs))
    backend.info = backend.init()
    return backend


def step(backend: Any, samples: list[TrainSample], cfg: Any, step_index: int = 0) -> dict[str, float]:
    """One training step of a one-rank backend on ``samples``."""
    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch

    packer = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1, num_minibatches=cfg.number_of_minibatches)
    return backend.train_step(RankBatch.from_packed(packer.pack(samples), 0, step_index))


def train_and_record(cfg: Any, batches: list[list[TrainSample]], **kwargs: Any) -> dict[str, Any]:
    """Train ``batches`` (one step each, SGD unless ``kwargs`` say otherwise) on this rank;
    return the step metrics and, on rank 0, the final weights."""
    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    backend = FSDPBackend(cfg, FSDPBackendKwargs(**{"optimizer": "sgd", **kwargs}))
    backend.init()
    packer = Packer(
        cfg.seq_len, cfg.pad_to_multiple_of, backend.dp_world_size, num_minibatches=cfg.number_of_minibatches
    )
    metrics = []
    for i, samples in enumerate(batches):
        packed = packer.pack(samples)
        metrics.append(backend.train_step(RankBatch.from_packed(packed, backend.dp_rank, i)))
    weights = {k: v.clone() for k, v in backend.iter_weights_for_inference()}
    return {"metrics": metrics, "weights": weights, "rank": backend.rank}


def distributed_worker(
    rank: int, world_size: int, port: int, cfg_json: str, batches: Any, out_dir: str
) -> None:
    """``torch.multiprocessing.spawn`` target: one gloo rank of ``train_and_record``."""
    import os

    import torch
    import torch.distributed as dist

    cfg = spawned_rank(rank, world_size, port, cfg_json)
    result = train_and_record(cfg, batches)
    # same run again, reducing gradients only after each minibatch's last row
    result["deferred_sync"] = train_and_record(cfg, batches, sync_gradients_every_micro_batch=False)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    dist.barrier()  # every rank is past its last collective and has written its results
    # End without interpreter teardown: a spawned rank's exit intermittently aborts in torch's C++
    # threads ("terminate called without an active exception", SIGABRT) after all work is done.
    os._exit(0)


def spawned_rank(rank: int, world_size: int, port: int, cfg_json: str) -> Any:
    """In a ``torch.multiprocessing.spawn`` worker: set the env of rank ``rank`` of a local
    ``world_size`` group on ``port`` (what ``init_process_group`` reads) and one torch thread;
    returns the run config the parent sent as JSON."""
    import os

    import torch

    from telescope.core.config import TelescopeConfig

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
        }
    )
    torch.set_num_threads(1)
    return TelescopeConfig.model_validate_json(cfg_json)
