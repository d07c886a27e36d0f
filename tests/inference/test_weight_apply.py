"""``apply=False`` on the vLLM path: the client's RPC and the worker extension (no vLLM needed).

The transformers engine's apply=False is tested end to end in test_weight_sync.py (a live
server keeps generating what the old weights give, the next applied sync loads the newest).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from aiohttp import web

from telescope.core.inference.vllm_engine.client import VllmClient
from telescope.core.inference.vllm_engine.guard import RPC_PATH
from telescope.core.inference.vllm_engine.worker import TelescopeWeightSyncExtension
from telescope.core.weights.group import free_port
from telescope.core.weights.receiver import ReceivedSync

from .conftest import FakeVllmReload


class FakeVllmWorkers:
    """A dev-mode vLLM server whose two TP workers run the real worker extension."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.workers = [_worker(), _worker()]

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/pause", "/resume"):
            app.router.add_post(path, self.control)
        app.router.add_post(RPC_PATH, self.rpc)
        return app

    async def control(self, request: web.Request) -> web.Response:
        self.calls.append(request.path)
        return web.json_response({})

    async def rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(f"rpc {body['method']} {body['args']} {body['kwargs']}")
        results = [getattr(w, body["method"])(*body["args"], **body["kwargs"]) for w in self.workers]
        return web.json_response({"results": results})


@dataclass
class FakeReceiver:
    """Stands in for ``WeightReceiver``: yields the next version's tensors, then records the sync."""

    version: int = 0
    last_sync: ReceivedSync | None = None

    def receive(self, expect_version: int | None = None) -> Any:
        self.version += 1
        assert expect_version == self.version  # the worker asks for the version it was told to load
        tensors = {"w": torch.full((2,), float(self.version))}
        yield from tensors.items()
        fps = {"w": f"float32:2:{self.version:016x}"}
        self.last_sync = ReceivedSync(self.version, len(tensors), fps)


@dataclass
class FakeModel:
    loaded: list[dict[str, torch.Tensor]] = field(default_factory=list)
    events: list[str] | None = None

    def load_weights(self, weights: Any) -> None:
        self.loaded.append({n: t.clone() for n, t in weights})
        if self.events is not None:
            self.events.append(f"load_weights {sorted(self.loaded[-1])}")


def _worker(events: list[str] | None = None) -> TelescopeWeightSyncExtension:
    worker = TelescopeWeightSyncExtension()
    worker.model_runner = type("Runner", (), {"model": FakeModel(events=events)})()
    worker.vllm_config, worker.model_config, worker.device = "VC", "MC", "cpu"
    worker._telescope_receiver = FakeReceiver()  # type: ignore[attr-defined]
    return worker


def test_weights_load_inside_vllms_config_context_and_layerwise_reload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As vLLM's own reload_weights: quantized / post-processed layers are processed again after the load."""
    fake = FakeVllmReload()
    fake.install(monkeypatch)
    worker = _worker(fake.events)
    out = worker.telescope_update_weights("1", "true")
    assert fake.events == [
        "config VC enter",
        "initialize_layerwise_reload",
        "load_weights ['w']",
        "finalize_layerwise_reload MC",
        "config VC exit",
    ]
    assert out["applied"] is True and out["version"] == 1
    with pytest.raises(ValueError, match="apply='True'; send the string 'true' or 'false'"):
        worker.telescope_update_weights("2", "True")


def test_vllm_update_without_applying_keeps_the_served_version(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeVllmReload().install(monkeypatch)
    fake = FakeVllmWorkers()

    async def go():  # type: ignore[no-untyped-def]
        runner = web.AppRunner(fake.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with VllmClient(f"http://127.0.0.1:{port}") as client:
                first = await client.update_weights(1)
                held = await client.update_weights(2, apply=False)
                served = await client.weight_version()
                last = await client.update_weights(3)
                return first, held, served, last
        finally:
            await runner.cleanup()

    first, held, served, last = asyncio.run(go())
    assert (first.version, first.received_version, first.applied) == (1, 1, True)
    # held: took part (received v2, transport fingerprints returned) but still serves v1
    assert (held.version, held.received_version, held.applied) == (1, 2, False)
    assert held.fingerprints == {"w": f"float32:2:{2:016x}"} and served == 1
    assert (last.version, last.received_version, last.applied) == (3, 3, True)
    for worker in fake.workers:  # v2 was never loaded; v3 (the newest) was
        loaded = worker.model_runner.model.loaded
        assert [float(d["w"][0]) for d in loaded] == [1.0, 3.0]
    # no pause around a full-weight sync that keeps the KV (vLLM runs the worker call between two
    # steps: VllmClient.update_weights); the held update applies nothing
    assert fake.calls == [
        "rpc telescope_update_weights ['1'] {'apply': 'true'}",
        "rpc telescope_update_weights ['2'] {'apply': 'false'}",
        "rpc telescope_weight_version [] {}",
        "rpc telescope_update_weights ['3'] {'apply': 'true'}",
    ]


def test_a_tied_embedding_sent_once_also_reaches_vllms_output_layer() -> None:
    """A trainer sends a tied model's embedding once; vLLM's layer-wise reload refreshes only layers
    that receive weights, so the worker hands the embedding to ``lm_head.weight`` too (once)."""
    import torch

    from telescope.core.inference.vllm_engine.worker import _with_tied_output_embedding

    embedding, layer = torch.arange(6.0).reshape(3, 2), torch.ones(2)
    sent = [("model.embed_tokens.weight", embedding), ("model.norm.weight", layer)]
    names = [name for name, _ in _with_tied_output_embedding(iter(sent))]
    assert names == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    loaded = dict(_with_tied_output_embedding(iter(sent)))
    embedding.zero_()  # the receiver reuses its buffers: the output layer gets what arrived
    assert torch.equal(loaded["lm_head.weight"], torch.arange(6.0).reshape(3, 2))
    # a sender that sends the output layer itself is left alone
    with_output = [*sent, ("lm_head.weight", torch.full((3, 2), 7.0))]
    passed = list(_with_tied_output_embedding(iter(with_output)))
    assert [name for name, _ in passed] == [name for name, _ in with_output]


@dataclass
class FakePlan:
    """Stands in for ``StagedReload`` (whose real runs are in make test-vllm-cpu)."""

    loaded: list[list[str]] = field(default_factory=list)
    repacked_tensors: int = 0

    def load(self, weights: Any) -> set[str]:
        self.loaded.append([name for name, _ in weights])
        return set(self.loaded[-1])


@pytest.mark.parametrize(
    ("mode", "plan", "expected"),
    [("auto", FakePlan(), "staged"), ("auto", None, "layerwise"), ("layerwise", FakePlan(), "layerwise")],
)
def test_the_reload_mode_picks_the_staged_path_only_where_it_applies(
    monkeypatch: pytest.MonkeyPatch, mode: str, plan: FakePlan | None, expected: str
) -> None:
    """auto: the staged plan when the model has one, vLLM's layer-wise reload when it declines
    (``StagedReload.build`` returned None); layerwise: always vLLM's."""
    fake = FakeVllmReload()
    fake.install(monkeypatch)
    worker = _worker(fake.events)
    monkeypatch.setattr(worker, "_telescope_reload_plan", lambda model: plan)
    out = worker.telescope_update_weights("1", "true", reload=mode)
    assert out["reload"] == expected
    layerwise_ran = "initialize_layerwise_reload" in fake.events
    assert layerwise_ran == (expected == "layerwise")
    if plan is not None:
        assert plan.loaded == ([["w"]] if expected == "staged" else [])
    assert set(out["timings"]) == {"total", "first_tensor", "receive", "load"}
    with pytest.raises(ValueError, match=r"reload='fast'; use one of \('auto', 'layerwise'\)"):
        worker.telescope_update_weights("2", "true", reload="fast")
