"""LoRA weight sync end to end: a real FSDP LoRA trainer process, a real transformers-engine server.

Proves the server samples the adapter just trained (its logprobs equal the trainer's for the same
tokens), that a sync moves exactly the adapter bytes, and that a server which claims a sync it did
not load is caught by the per-sample weight-version check even though the fingerprints agree.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("telescope.fsdp")

import torch.multiprocessing as mp  # noqa: E402

from telescope.core.weights.errors import StaleWeightsError  # noqa: E402
from telescope.core.weights.group import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import the workers by module name
workers = importlib.import_module("lora_workers")

RANK = 4


def adapter_bytes(model_path: str, rank: int) -> int:
    """fp32 bytes of rank-``rank`` adapters on every linear layer of the decoder, from the config alone."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    h, inter, head = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down
    return c.num_hidden_layers * sum(rank * (i + o) for i, o in shapes) * 4


def test_server_samples_the_adapter_just_trained(tiny_path: str, tmp_path: Path) -> None:
    from telescope.core.inference.protocol import WeightSyncInitRequest
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine

    from .conftest import make_cfg

    cfg = make_cfg(
        model=tiny_path,
        lora_rank=RANK,
        lora_alpha=8.0,
        learning_rate=5e-2,
        mixed_precision_dtype=None,
        seq_len=64,
        pad_to_multiple_of=8,
        temperature=1.0,
    )
    kwargs = TransformersEngineKwargs(num_threads=1, startup_timeout_s=120, fault_skip_weight_syncs=[3])
    engine = TransformersEngine(cfg, kwargs)
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(tmp_path))
    ctx = mp.get_context("spawn")
    commands, answers = ctx.Queue(), ctx.Queue()
    store_port = free_port()
    trainer = ctx.Process(
        target=workers.lora_trainer_worker, args=(store_port, cfg.model_dump_json(), commands, answers)
    )
    trainer.start()
    prompt = [5, 17, 42, 99, 7]

    async def ask(*command: Any) -> Any:
        commands.put(command)
        return await asyncio.to_thread(answers.get, True, 120)

    async def sample(client: Any) -> Any:
        (out,) = await client.complete(prompt, temperature=1.0, max_tokens=12, ignore_eos=True, seed=3)
        return out

    async def go() -> dict[str, Any]:
        seen: dict[str, Any] = {"info": await asyncio.to_thread(answers.get, True, 120)}
        async with engine.client(server.url) as client:
            base = await sample(client)
            seen["base"] = (base, await ask("logprobs", prompt, base.token_ids))
            request = WeightSyncInitRequest(
                host="127.0.0.1", port=store_port, world_size=2, rank=1, group_name=workers.GROUP
            )
            await asyncio.gather(ask("join"), client.init_weight_sync(request))
            for version in (1, 2, 3):
                await ask("train")
                sent, update = await asyncio.gather(ask("sync", version), client.update_weights(version))
                seen[f"sync{version}"] = (sent, update)
                if version == 3:
                    with pytest.raises(StaleWeightsError) as err:
                        await sample(client)
                    seen["stale"] = str(err.value)
                    break
                out = await sample(client)
                seen[f"v{version}"] = (out, await ask("logprobs", prompt, out.token_ids))
        commands.put(("stop",))
        return seen

    try:
        seen = asyncio.run(go())
        trainer.join(60)
    finally:
        server.stop()
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0
    want_bytes = adapter_bytes(tiny_path, RANK)
    assert seen["info"]["trainable_parameters"] * 4 == want_bytes
    base, base_trainer = seen["base"]
    torch.testing.assert_close(torch.tensor(base.logprobs), torch.tensor(base_trainer), atol=1e-5, rtol=0)
    for version in (1, 2):
        (num_bytes, num_tensors, fingerprints), update = seen[f"sync{version}"]
        assert num_bytes == want_bytes  # adapter-only: exactly the adapter tensors' bytes, nothing else
        assert update.fingerprints == fingerprints and update.num_tensors == num_tensors
        out, trainer_logprobs = seen[f"v{version}"]
        assert out.weight_versions == [version]
        # the server's logprobs are the trainer's (base + this step's adapter) for the same tokens ...
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(trainer_logprobs), atol=1e-5, rtol=0
        )
    # ... and the adapter moved them away from the base model's
    v1, v1_trainer = seen["v1"]
    assert (
        v1.token_ids != base.token_ids
        or max(abs(a - b) for a, b in zip(v1.logprobs, base.logprobs, strict=True)) > 1e-3
    )
    # version 3 was "loaded" per the server's answer, with the sender's fingerprints: only the versions
    # the server reports for its samples show that it still serves version 2
    (_, _, fingerprints), update = seen["sync3"]
    assert update.applied and update.version == 3 and update.fingerprints == fingerprints
    assert (
        "sampled with weight version(s) [2]" in seen["stale"]
        and "confirmed loading version 3" in seen["stale"]
    )


def test_sampled_versions_must_lie_between_the_confirmed_and_the_newest_sync() -> None:
    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.protocol import WeightUpdateResponse

    client = InferenceClient("http://127.0.0.1:9")
    client.check_sampled_versions([0, 7], None)  # nothing confirmed yet: nothing to check against
    client._newest_version = 4  # a sync to version 4 is under way ...
    client._confirmed(WeightUpdateResponse(version=3, num_tensors=1, seconds=0.0))  # ... 3 was loaded
    assert client.served_version == 3
    client.check_sampled_versions([3, 4], 3)  # a request sent at 3 may finish with 4's weights
    with pytest.raises(StaleWeightsError, match=r"version\(s\) \[2\]"):
        client.check_sampled_versions([2, 3], 3)  # older than what the server confirmed
    with pytest.raises(StaleWeightsError, match=r"\[5\]"):
        client.check_sampled_versions([5], 3)  # never synced
    client._confirmed(WeightUpdateResponse(version=3, applied=False, num_tensors=1, seconds=0.0))
    assert client.served_version == 3  # a held (apply=False) sync changes nothing
