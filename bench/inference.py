"""Tokens/s of the transformers engine (HTTP server + batcher) next to plain ``model.generate``.

    .venv/bin/python bench/inference.py [--model telescope/tiny] [--concurrency 1,8,32] [--max-tokens 64]

Same prompts, same number of generated tokens (``ignore_eos``), sampling at temperature 1. The
engine serves ``c`` concurrent HTTP requests (one sample each) on 127.0.0.1; ``generate`` runs
the same ``c`` prompts as one left-padded batch with a KV cache. Figures are medians of --reps.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 40, (count,), generator=gen).tolist()
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in lengths]


async def engine_run(url: str, batch: list[list[int]], max_tokens: int) -> int:
    from telescope.core.inference.client import InferenceClient

    async with InferenceClient(url) as client:
        outs = await asyncio.gather(
            *[client.complete(p, max_tokens=max_tokens, ignore_eos=True) for p in batch]
        )
    return sum(len(o[0].token_ids) for o in outs)


def generate_run(model, batch: list[list[int]], max_tokens: int) -> int:  # type: ignore[no-untyped-def]
    width = max(len(p) for p in batch)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.no_grad():
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
        )
    return int((out.shape[1] - width) * len(batch))


def timed(fn, reps: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    samples, tokens = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        tokens = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="telescope/tiny")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import start_in_thread
    from telescope.core.models import resolve_model_path
    from telescope.core.testing import make_config
    from telescope.core.weights.group import free_port

    cfg = make_config(model=args.model, max_model_len=1024, enable_vllm_tracing=False)
    server = start_in_thread(
        cfg, TransformersEngineKwargs(max_num_seqs=64, num_threads=args.threads), port=free_port()
    )
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model)).eval()
    print(
        f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, {args.threads} thread(s), "
        f"{args.max_tokens} tokens per sample, median of {args.reps}"
    )
    print(f"{'concurrent':>10} {'engine tok/s':>13} {'generate tok/s':>15} {'ratio':>6}")
    try:
        for count in (int(c) for c in args.concurrency.split(",")):
            batch = prompts(count)
            t_engine, n_engine = timed(
                lambda b=batch: asyncio.run(engine_run(server.url, b, args.max_tokens)), args.reps
            )
            t_gen, n_gen = timed(lambda b=batch: generate_run(model, b, args.max_tokens), args.reps)
            rate_engine, rate_gen = n_engine / t_engine, n_gen / t_gen
            print(f"{count:>10} {rate_engine:>13.0f} {rate_gen:>15.0f} {rate_engine / rate_gen:>6.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
