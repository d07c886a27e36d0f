"""A LoRA trainer rank 0 in its own process (spawned by test_lora_sync.py): the real FSDP backend
with peft adapters, the real weight sender; commands arrive on a queue, answers go back on another."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

#: The group name of these tests, on both sides (a server joins only a name with a nonce).
GROUP = "telescope-weights-" + "6" * 32


def _samples(seed: int, vocab: int) -> list[Any]:
    from telescope.core.trainer import TrainSample

    rng = random.Random(seed)
    return [
        TrainSample(
            prompt_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))],
            completion_ids=(c := [rng.randrange(3, vocab) for _ in range(rng.randint(4, 16))]),
            inference_logprobs=[-rng.uniform(3.0, 6.0) for _ in c],
            advantage=rng.uniform(-1.5, 1.5),
        )
        for _ in range(6)
    ]


@torch.no_grad()
def _logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    """The trainer's logprobs of ``tokens`` after ``prompt`` (one unpacked sequence)."""
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def lora_trainer_worker(store_port: int, cfg_json: str, commands: Any, answers: Any) -> None:
    from telescope.core.config import TelescopeConfig
    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch
    from telescope.core.weights.group import WeightSyncGroup, free_port
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.settings import GroupSpec, WeightSyncSettings
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    torch.set_num_threads(1)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
    )
    cfg = TelescopeConfig.model_validate_json(cfg_json)
    backend = FSDPBackend(cfg, FSDPBackendKwargs(device="cpu"))
    answers.put(backend.init())
    vocab = int(backend.state.model.config.vocab_size)
    sender: WeightSender | None = None
    step = 0
    while True:
        command, *args = commands.get()
        if command == "stop":
            break
        if command == "train":
            packer = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1)
            backend.train_step(RankBatch.from_packed(packer.pack(_samples(step, vocab)), 0, step))
            step += 1
            answers.put(step)
        elif command == "join":  # sent while the server joins: the group forms once both are in
            spec = GroupSpec(host="127.0.0.1", port=store_port, world_size=2, timeout_s=120, group_name=GROUP)
            sender = WeightSender(WeightSyncGroup(spec, 0), WeightSyncSettings.from_config(cfg))
            answers.put(True)
        elif command == "sync":
            assert sender is not None, "join first"
            report = sender.send(backend.iter_weights_for_inference(), int(args[0]))
            answers.put((report.num_bytes, report.num_tensors, report.fingerprints))
        elif command == "logprobs":
            answers.put(_logprobs(backend.state.model, list(args[0]), list(args[1]), cfg.temperature))
