"""A weight sync into vLLM, phase by phase, side by side with the transformers engine (the quickstart
model, float32, one server each, both started by their engines as in a run; the trainer side is this
process, over gloo).

    .venv-vllm-cpu/bin/python bench/vllm_sync.py [--reps 15] [--model telescope/tiny-reverse]

Per engine, the whole sync as a run does it (``client.update_weights`` with the send beside it; vLLM
with ``vllm_weight_reload: auto``, the staged reload), then the vLLM sync taken apart into the calls
it can make: ``POST /pause`` (mode keep, sent only with ``pause_clear_cache`` or LoRA), the
worker-extension call that receives and loads (``telescope_update_weights``) with each reload
(``staged``: vLLM's loaders straight into the model, ``layerwise``: vLLM's layer-wise reload, the
worker's own timings beside it), ``POST /resume``; and, to split the worker
call, the same call receiving only (``apply=false``: transfer and fingerprints, no load) and a no-op
worker call (``telescope_weight_version``: the round trip through the guard, vLLM's engine core and its
worker process). Medians over ``--reps`` rounds; both engines take turns within each round, so the
ratio is measured under the same load. Needs vLLM (``make test-vllm-cpu`` builds .venv-vllm-cpu).
``--cpu-weight-prepack``: vLLM's CPU build with its own default, linear weights prepacked for oneDNN
(each sync re-packs them; Telescope's default keeps them unpacked, ``vllm_engine/cpu_gemm.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch

from telescope.core.weights import WeightSyncSettings
from telescope.core.weights.group import free_port
from telescope.core.weights.sender import WeightSender


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


#: The worker's own timings of one receive + load call (``TelescopeWeightSyncExtension``).
WORKER_TIMINGS = {
    "first_tensor": "call start to first tensor",
    "receive": "in the receiver (first tensor's wait included)",
    "load": "loading",
}


class Side:
    """One engine's server, its client, and the trainer end of its sync group."""

    def __init__(self, name: str, engine: Any, server: Any, client: Any, sender: WeightSender) -> None:
        self.name, self.engine, self.server, self.client, self.sender = name, engine, server, client, sender
        self.version = 0

    async def sync(self, named: list[tuple[str, torch.Tensor]]) -> float:
        """One whole sync as a run makes it (a new version, loaded); seconds."""
        self.version += 1
        start = time.perf_counter()
        update = asyncio.create_task(self.client.update_weights(self.version))
        await asyncio.to_thread(self.sender.send, iter(named), self.version)
        await update
        return time.perf_counter() - start

    async def worker_call(
        self, named: list[tuple[str, torch.Tensor]], apply: bool, reload: str = ""
    ) -> tuple[float, dict[str, float]]:
        """vLLM only: the worker-extension call alone (no pause or resume around it); seconds, and
        the worker's own timings (``first_tensor``, ``receive``, ``load``, ``total``)."""
        self.version += 1 if apply else 0
        start = time.perf_counter()
        call = asyncio.create_task(
            self.client._rpc(
                "telescope_update_weights",
                str(self.version),
                apply="true" if apply else "false",
                reload=reload,
            )
        )
        await asyncio.to_thread(self.sender.send, iter(named), self.version)
        results = await call
        return time.perf_counter() - start, dict(results[0]["timings"])


async def _open(name: str, engine: Any, logs: str) -> Side:
    from telescope.core.testing import join_local_sync_group

    server = engine.launch(0, host="127.0.0.1", port=free_port(), log_dir=logs)
    client = engine.client(server.url)
    await client.__aenter__()
    group = await join_local_sync_group(client)
    return Side(name, engine, server, client, WeightSender(group, WeightSyncSettings(dtype="float32")))


def _engines(model: str, prepack: bool) -> dict[str, Any]:
    from telescope.core.inference.settings import TransformersEngineKwargs, VllmEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine
    from telescope.core.inference.vllm_engine.engine import VllmEngine
    from telescope.core.testing import make_config, small_vllm_engine

    fields = {"model": model, "model_dtype": "float32", "mixed_precision_dtype": None}
    transformers = TransformersEngine(
        make_config(inference_engine="transformers", enable_vllm_tracing=False, **fields),
        TransformersEngineKwargs(),
    )
    vllm = small_vllm_engine(**fields)
    kwargs = VllmEngineKwargs(**{**vllm.kwargs.model_dump(), "cpu_weight_prepack": prepack})
    return {"transformers": transformers, "vllm": VllmEngine(vllm.cfg, kwargs)}


async def bench(model: str, reps: int, prepack: bool) -> None:
    from transformers import AutoModelForCausalLM

    from telescope.core.models.tiny import resolve_model_path

    weights = AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=torch.float32)
    named = [(n, t.detach()) for n, t in weights.state_dict().items()]
    size_mb = sum(t.numel() * t.element_size() for _, t in named) / 1e6
    with tempfile.TemporaryDirectory() as logs:
        sides = {}
        for name, engine in _engines(model, prepack).items():
            t0 = time.perf_counter()
            sides[name] = await _open(name, engine, logs)
            print(f"{name}: server healthy and joined the sync group in {time.perf_counter() - t0:.1f} s")
        try:
            await _rounds(sides, named, reps, size_mb)
        finally:
            for side in sides.values():
                await side.client.__aexit__(None, None, None)
                side.server.stop()


async def _rounds(
    sides: dict[str, Side], named: list[tuple[str, torch.Tensor]], reps: int, mb: float
) -> None:
    vllm, other = sides["vllm"], sides["transformers"]
    for side in sides.values():  # warm-up: first syncs allocate buffers
        for _ in range(2):
            await side.sync(named)
    times: dict[str, list[float]] = {}

    def record(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)

    for _ in range(reps):
        record("transformers: whole sync", await other.sync(named))
        record("vllm: whole sync", await vllm.sync(named))
        record("vllm: POST /pause (keep)", await _timed(lambda: vllm.client.pause("keep")))
        for mode, how in (("auto", "staged"), ("layerwise", "layerwise")):
            seconds, inside = await vllm.worker_call(named, apply=True, reload=mode)
            record(f"vllm: worker call, receive + load ({how})", seconds)
            for key in ("first_tensor", "receive", "load"):
                record(f"vllm ({how}): inside the worker: {WORKER_TIMINGS[key]}", inside[key])
        record("vllm: POST /resume", await _timed(vllm.client.resume))
        record("vllm: worker call, receive only", (await vllm.worker_call(named, apply=False))[0])
        record("vllm: worker call, no-op round trip", await _timed(vllm.client.weight_version))
    medians = {key: statistics.median(values) for key, values in times.items()}
    ratio = statistics.median(
        v / t for v, t in zip(times["vllm: whole sync"], times["transformers: whole sync"], strict=True)
    )
    print(f"\nquickstart model, {len(named)} tensors, {mb:.2f} MB float32; medians of {reps} rounds\n")
    print("| phase | median ms |\n|---|---|")
    for key, value in medians.items():
        print(f"| {key} | {value * 1e3:.1f} |")
    for how in ("staged", "layerwise"):
        load = (
            medians[f"vllm: worker call, receive + load ({how})"] - medians["vllm: worker call, receive only"]
        )
        print(f"| vllm: load alone, {how} (receive + load minus receive only) | {load * 1e3:.1f} |")
    print(f"\nvllm / transformers, whole sync (median of per-round ratios): {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--model", default="telescope/tiny-reverse")
    parser.add_argument(
        "--cpu-weight-prepack",
        action="store_true",
        help="vLLM's CPU build: linear weights prepacked for oneDNN (vLLM's default; each sync re-packs "
        "them), not Telescope's default unpacked weights (VllmEngineKwargs.cpu_weight_prepack)",
    )
    args = parser.parse_args()
    print(
        f"vLLM CPU linear weights: {'prepacked (oneDNN)' if args.cpu_weight_prepack else 'unpacked (default)'}"
    )
    asyncio.run(bench(args.model, args.reps, args.cpu_weight_prepack))


if __name__ == "__main__":
    main()
