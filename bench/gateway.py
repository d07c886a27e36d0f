"""The gateway's cost: per-call overhead and calls/s through the gateway, beside a direct engine call.

Run: ``.venv/bin/python bench/gateway.py [--calls 400] [--concurrency 1,32] [--tokens 64]``.

A stub engine (an aiohttp server answering ``/v1/completions`` at once with ``--tokens`` fixed token
ids and logprobs: no model) stands in for the engine, so the figures are the gateway's own work:
HTTP in and out, the chat template, decoding, tool-call parsing, the answer's JSON. Three paths,
each with ``--calls`` calls at each concurrency:

- ``direct``: ``InferenceClient.complete`` to the engine (what the orchestrator does);
- ``gateway completions``: ``POST /v1/completions`` with token ids, to the gateway, which calls the
  engine the same way;
- ``gateway chat``: ``POST /v1/chat/completions`` with three messages (rendered by the built-in tiny
  model's chat template, tokenized, answered with a message) under a rollout key (captured).

The gateway runs in the driver's process and loop, as in a run (``runtime.assemble``); this script
runs everything on one event loop on this machine. Printed: median and p90 latency per call, calls/s,
and the overhead per call over ``direct``. Figures are wall clock; compare them on one machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "reverse the word: telescope"},
    {"role": "assistant", "content": "epocselet"},
]


def stub_engine(tokens: int) -> web.Application:
    """An engine stand-in: every completion is ``tokens`` fixed ids with logprob -0.5 (no model)."""
    ids = [(17 + 13 * i) % 300 + 20 for i in range(tokens)]

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        choice = {
            "index": 0,
            "text": "",
            "token_ids": ids,
            "prompt_token_ids": body["prompt"],
            "finish_reason": "length",
            "weight_versions": [0],
            "logprobs": {"tokens": [], "token_logprobs": [-0.5] * tokens, "top_logprobs": None},
        }
        choices = [{**choice, "index": i} for i in range(body.get("n", 1))]
        return web.json_response({"id": "cmpl-stub", "choices": choices, "usage": {}})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _timed(
    call: Callable[[], Awaitable[Any]], calls: int, concurrency: int
) -> tuple[list[float], float]:
    """Per-call latencies (s) and calls/s of ``calls`` calls, ``concurrency`` at a time."""
    latencies: list[float] = []
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    for _ in range(min(20, calls)):  # warm up connections and caches
        await call()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, calls / (time.perf_counter() - start)


async def run(calls: int, levels: list[int], tokens: int) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.gateway.app import Gateway, GatewaySettings
    from telescope.core.inference.gateway.serve import start_gateway
    from telescope.core.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny"))
    prompt = tokenizer(tokenizer.apply_chat_template(MESSAGES, tokenize=False), add_special_tokens=False)[
        "input_ids"
    ]
    engine_site, engine_url = await _serve(stub_engine(tokens))
    engine = InferenceClient(engine_url)
    gateway = Gateway(engine, tokenizer, GatewaySettings(served_model_name="tiny", max_model_len=4096))
    gateway_site, url = await start_gateway(gateway)
    session = gateway.capture.open("bench")
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def post(path: str, body: dict[str, Any], key: str = "x") -> None:
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(url + path, json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "direct": lambda: engine.complete(prompt, max_tokens=tokens),
            "gateway completions": lambda: post(
                "/completions", {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "logprobs": 0}
            ),
            "gateway chat": lambda: post(
                "/chat/completions",
                {"model": "tiny", "messages": MESSAGES, "max_tokens": tokens},
                session.key,
            ),
        }
        for concurrency in levels:
            for name, call in paths.items():
                latencies, rate = await _timed(call, calls, concurrency)
                latencies.sort()
                rows.append(
                    {
                        "path": name,
                        "concurrency": concurrency,
                        "median_ms": statistics.median(latencies) * 1e3,
                        "p90_ms": latencies[int(0.9 * (len(latencies) - 1))] * 1e3,
                        "calls_per_s": rate,
                    }
                )
            session.calls.clear()  # captured calls are not what is measured; keep memory flat
    await gateway_site.cleanup()
    await engine.close()
    await engine_site.cleanup()
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    """The table, with each gateway path's overhead per call over ``direct`` at the same concurrency."""
    direct = {r["concurrency"]: r for r in rows if r["path"] == "direct"}
    lines = [
        f"{'path':<22}{'conc':>5}{'median ms':>11}{'p90 ms':>9}{'calls/s':>10}{'overhead ms':>13}",
    ]
    for r in rows:
        base = direct[r["concurrency"]]
        overhead = "" if r["path"] == "direct" else f"{r['median_ms'] - base['median_ms']:+.2f}"
        lines.append(
            f"{r['path']:<22}{r['concurrency']:>5}{r['median_ms']:>11.2f}{r['p90_ms']:>9.2f}"
            f"{r['calls_per_s']:>10.0f}{overhead:>13}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per path and concurrency")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated concurrency levels")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens the stub engine answers")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    rows = asyncio.run(run(args.calls, levels, args.tokens))
    print(f"gateway vs direct engine call (stub engine, {args.tokens} tokens; load {os.getloadavg()[0]:.1f})")
    print(report(rows))


if __name__ == "__main__":
    main()
