"""Weight sync over gloo between separate processes: both modes, verification, and a live server update."""

from __future__ import annotations

import asyncio
import importlib
import queue as queue_mod
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import torch
import torch.multiprocessing as mp

from telescope.core.cluster.run_secret import auth_headers
from telescope.core.weights import WeightSyncError, WeightSyncMismatchError
from telescope.core.weights.fingerprint import fingerprint
from telescope.core.weights.group import free_port
from telescope.core.weights.load import ModelWeightLoader

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import the workers by module name
workers = importlib.import_module("sync_workers")


def drain(q, count: int, timeout: float = 120.0) -> list:  # type: ignore[no-untyped-def]
    items = []
    for _ in range(count):
        try:
            items.append(q.get(timeout=timeout))
        except queue_mod.Empty:
            raise AssertionError(f"only {len(items)} of {count} messages arrived") from None
    return items


def test_group_sync_both_modes_cache_and_corruption() -> None:
    from telescope.core.weights.verify import check_sync

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(
        workers.group_worker, args=(free_port(), 3, q), nprocs=3, start_method="spawn", join=True
    )
    items = drain(q, len(workers.PLAN) * 3)
    sent = {v: (counts, fps) for _, v, counts, fps in (i for i in items if i[0] == "sent")}
    names = [n for n, _ in workers.example_tensors(1)]
    # 1 MB buckets: message 0 = 3 small tensors (flat) + the 2.4 MB one (direct), message 1 = 2 small.
    # (broadcasts, metadata sent, combined messages) per sync:
    # v1 (no history): header + meta + flat + direct, then header + meta + flat = 7
    # v2 per_tensor (new layouts): header + meta + 4 direct, then header + meta + 2 direct = 10
    # v3 (layouts of v1, cached; history holds v2's): header + flat + direct, header + flat = 5
    # v4, v5 (layouts predicted): header+flat combined + direct, header+flat combined = 3
    assert [sent[v][0] for v in (1, 2, 3, 4, 5)] == [(7, 2, 0), (10, 2, 0), (5, 0, 0), (3, 0, 2), (3, 0, 2)]
    for version, (_, fps) in sent.items():  # sender fingerprints are the tensors' own
        assert fps == {n: fingerprint(t) for n, t in workers.example_tensors(version)}
    got = [i for i in items if i[0] == "got"]
    assert len(got) == 10  # 2 receivers x 5 syncs: the corrupted v4 keeps the protocol in step
    for _, rank, version, received, same, _, fps in got:
        assert received == names
        if version == workers.CORRUPTED[1]:  # the wrong byte landed, and the fingerprints show it
            assert same == [n for n in names if n != workers.CORRUPTED[0]], (rank, version)
            with pytest.raises(WeightSyncMismatchError, match="1 tensor") as info:
                check_sync(sent[version][1], {f"rank {rank}": fps}, version)
            assert info.value.tensors == [workers.CORRUPTED[0]]
        else:
            assert same == names, (rank, version)
            check_sync(sent[version][1], {f"rank {rank}": fps}, version)
    # v5 has the layout of v4 and v3: its data landed in the buffers they used (no fresh
    # allocation) and is right; v3 followed v2's other layout, so it needed new buffers
    ptrs = {(rank, version): ptr for _, rank, version, _, _, ptr, _ in got}
    for rank in (1, 2):
        assert ptrs[(rank, 5)] == ptrs[(rank, 3)] and ptrs[(rank, 3)] != ptrs[(rank, 2)]


def test_a_stream_of_the_wrong_version_stops_before_its_first_tensor() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(workers.version_check_worker, args=(free_port(), q), nprocs=2, start_method="spawn")
    ((kind, message, seen),) = drain(q, 1)
    assert kind == "WeightSyncError" and seen == []  # nothing reached a streaming consumer
    assert "asked to load version 2 but the trainer is sending version 3" in message


def test_loader_rejects_bad_updates_before_touching_the_model() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    loader = ModelWeightLoader(model)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    good = {n: torch.full_like(t, 0.5) for n, t in model.state_dict().items()}
    with pytest.raises(WeightSyncError, match="does not have: 9.weight"):
        loader.check({**good, "9.weight": torch.zeros(1)})
    with pytest.raises(WeightSyncError, match=r"0.weight \(got \(3, 2\)"):
        loader.check({**good, "0.weight": torch.zeros(3, 2)})
    with pytest.raises(WeightSyncError, match="unchanged: 1.bias"):
        loader.check({n: t for n, t in good.items() if n != "1.bias"})
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())
    loader.check(good)
    loader.apply(good)
    assert set(loader.verify(good, where="test")) == set(good)
    with torch.no_grad():
        model[1].weight[0, 0] += 1e-3  # a tensor that did not land as sent
    with pytest.raises(WeightSyncMismatchError, match="1 tensor") as info:
        loader.verify(good, where="test")
    assert info.value.tensors == ["1.weight"]


def _reference(model_path: str, version: int, prompt: list[int], max_tokens: int):  # type: ignore[no-untyped-def]
    """Greedy tokens and their logprobs under the new weights, computed here with plain transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.load_state_dict(workers.perturbed_state(model_path, seed=version))
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        tokens = out[0, len(prompt) :].tolist()
        logits = model(out).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
    return tokens, logprobs


def test_trainer_process_updates_a_running_server(tiny_path: str, tmp_path: Path) -> None:
    """v1 is loaded (flattened_bucket), v2 is received with apply=False (an eval server held at v1),
    v3 is loaded (per_tensor): both broadcast modes change a live server's outputs."""
    from telescope.core.inference.protocol import WeightSyncInitRequest
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine

    from .conftest import make_cfg

    engine = TransformersEngine(make_cfg(), TransformersEngineKwargs(num_threads=1, startup_timeout_s=120))
    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=str(tmp_path))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store_port = free_port()
    plan = [("flattened_bucket", 1, True), ("per_tensor", 2, False), ("per_tensor", 3, True)]
    trainer = ctx.Process(
        target=workers.trainer_worker, args=(store_port, [(m, v) for m, v, _ in plan], tiny_path, q)
    )
    trainer.start()
    prompt = [5, 17, 42, 99, 7]
    try:

        async def go():  # type: ignore[no-untyped-def]
            results = []
            async with (
                aiohttp.ClientSession() as http,
                http.get(server.url + "/v1/models", headers=auth_headers()) as resp,
            ):
                served_len = (await resp.json())["data"][0]["max_model_len"]
            async with engine.client(server.url) as client:
                results.append(await client.complete(prompt, temperature=0.0, max_tokens=12, ignore_eos=True))
                await client.init_weight_sync(
                    WeightSyncInitRequest(
                        host="127.0.0.1", port=store_port, world_size=2, rank=1, group_name=workers.GROUP
                    )
                )
                for _, version, apply in plan:
                    update = await client.update_weights(version, apply=apply)
                    out = await client.complete(prompt, temperature=0.0, max_tokens=12, ignore_eos=True)
                    results.append((update, out, await client.weight_version()))
            return served_len, results

        served_len, (before, *after) = asyncio.run(go())
        trainer.join(60)
        sent = {v: fps for v, fps, _ in drain(q, len(plan))}
    finally:
        server.stop()
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0
    assert served_len == 512  # the server process runs the resolved config (make_cfg), not the 4096 default
    served_before = 0
    for (_, version, apply), (update, out, served) in zip(plan, after, strict=True):
        # what the server holds == what the trainer sent (loaded), or == what arrived (held back)
        assert update.fingerprints == sent[version]
        assert update.received_version == version and update.applied is apply
        # the load's own time (the swap between two decode steps) is part of the whole server time
        assert (update.load_seconds is not None) is apply
        assert not apply or 0 < update.load_seconds <= update.seconds
        if not apply:  # the held server keeps its weights and version: the same outputs, bit for bit
            assert served == served_before and update.version == served_before
            held = after[plan.index(("flattened_bucket", served_before, True))][1][0]
            assert out[0].token_ids == held.token_ids and out[0].logprobs == held.logprobs
            assert out[0].weight_versions == [served_before]
            continue
        tokens, logprobs = _reference(tiny_path, version, prompt, 12)
        assert served == version and update.version == version
        assert out[0].token_ids == tokens and out[0].weight_versions == [version]
        assert torch.allclose(torch.tensor(out[0].logprobs), logprobs, atol=1e-5, rtol=0)
        # the tiny random model's greedy text can stay the same; its distribution must not
        assert (torch.tensor(out[0].logprobs) - torch.tensor(before[0].logprobs)).abs().max() > 1e-2
        served_before = version
    # v2 was not loaded, so the v3 sync loaded the newest weights (checked against v3's reference above)
    assert [u.applied for u, _, _ in after] == [True, False, True]


def test_fingerprint_is_xxh3_of_the_bytes_and_sees_one_changed_element() -> None:
    import xxhash

    from telescope.core.weights.fingerprint import digest, format_fingerprint

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expected = xxhash.xxh3_64_hexdigest(t.numpy().tobytes())
    assert fingerprint(t) == f"float32:3x4:{expected}"
    assert fingerprint(t.t().contiguous().t()) == fingerprint(t)  # layout independent
    assert format_fingerprint("float32", (3, 4), digest(t)) == fingerprint(t)
    changed = t.clone()
    changed.view(torch.int32)[2, 3] ^= 1  # one bit of one element
    assert fingerprint(changed) != fingerprint(t)
    assert fingerprint(torch.tensor(1.5, dtype=torch.bfloat16)).startswith("bfloat16::")


def test_check_sync_compares_every_server_and_never_passes_by_omission() -> None:
    from telescope.core.weights.verify import check_sync

    sent = {"a": "float32:2:01", "b": "float32:2:02"}
    check_sync(sent, {"s0": dict(sent), "s1": dict(sent)}, version=3)
    with pytest.raises(WeightSyncMismatchError, match="s1") as info:
        check_sync(sent, {"s0": dict(sent), "s1": {**sent, "b": "float32:2:ff"}}, version=3)
    assert info.value.tensors == ["b"]
    with pytest.raises(WeightSyncMismatchError, match="no fingerprints"):
        check_sync(sent, {"s0": None}, version=3)


def test_loader_verify_reuses_received_fingerprints_only_without_a_cast() -> None:
    model = torch.nn.Linear(3, 2)  # float32 parameters
    loader = ModelWeightLoader(model)
    named = {"weight": torch.full((2, 3), 0.25), "bias": torch.full((2,), 0.5, dtype=torch.float64)}
    loader.apply(named)
    # a wrong received fingerprint for "weight" (no cast) is taken as what arrived, so it is caught
    with pytest.raises(WeightSyncMismatchError) as info:
        loader.verify(named, where="test", received={"weight": "float32:2x3:00", "bias": "float64:2:00"})
    assert info.value.tensors == ["weight"]  # "bias" arrived as float64: hashed again after the cast
    received = {"weight": fingerprint(named["weight"]), "bias": "float64:2:00"}
    assert loader.verify(named, where="test", received=received) == {
        "weight": fingerprint(model.weight),
        "bias": fingerprint(model.bias),
    }


def test_the_plan_cache_tells_layouts_apart_by_name_dtype_and_shape() -> None:
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.sender import WeightSender
    from telescope.core.weights.wire import LayoutHistory, MetaCache

    class Group:  # what the sender reads of its group before anything is broadcast
        rank, device = 0, torch.device("cpu")
        meta_cache, layouts = MetaCache(), LayoutHistory()

    sender = WeightSender(Group(), WeightSyncSettings())  # type: ignore[arg-type]
    base = [("a", torch.zeros(4, 4)), ("b", torch.zeros(8))]
    variants = [
        base,
        [("a", torch.zeros(4, 4)), ("b", torch.zeros(9))],  # another shape
        [("a", torch.zeros(4, 4)), ("b", torch.zeros(8, dtype=torch.bfloat16))],  # another dtype
        [("a", torch.zeros(4, 4)), ("c", torch.zeros(8))],  # another name
    ]
    plans = [sender._planned(v) for v in variants]
    keys = [key for _, _, key in plans]
    assert len(set(keys)) == 4  # four layouts, four plans
    assert (
        sender._planned([("a", torch.ones(4, 4)), ("b", torch.ones(8))]) is plans[0]
    )  # values do not matter
    for (meta, _, _), pending in zip(plans, variants, strict=True):
        assert [(s.name, s.shape) for s in meta.slots] == [(n, tuple(t.shape)) for n, t in pending]


class FakeNcclGroup:
    """Fake of an NCCL weight-sync group (no GPU here) with NCCL's timing semantics: a broadcast's
    ``work.wait()`` returns at once, the bytes move later on the device, and only a device
    synchronize returns after they did (here: after ``transfer_s``)."""

    rank, device = 0, torch.device("cpu")

    def __init__(self, transfer_s: float) -> None:
        from telescope.core.weights.wire import LayoutHistory, MetaCache

        self.meta_cache, self.layouts = MetaCache(), LayoutHistory()
        self.transfer_s = transfer_s
        self.pending = 0

    def broadcast(self, tensor: torch.Tensor) -> Any:
        self.pending += 1
        return SimpleNamespace(wait=lambda: None)

    def synchronize(self) -> None:
        if self.pending:
            time.sleep(self.transfer_s)
            self.pending = 0


def test_the_sync_time_includes_the_device_transfer_not_only_the_launch() -> None:
    from telescope.core.weights import WeightSyncSettings
    from telescope.core.weights.sender import WeightSender

    group = FakeNcclGroup(transfer_s=0.3)
    report = WeightSender(group, WeightSyncSettings()).send(iter([("w", torch.ones(8))]), 1)  # type: ignore[arg-type]
    assert report.seconds >= 0.3 and group.pending == 0


def test_device_synchronize_waits_for_cuda_devices_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope.core.weights.group import device_synchronize

    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    device_synchronize(torch.device("cpu"))
    device_synchronize(torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)]
