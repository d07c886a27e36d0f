"""Cache-aware routing in real runs: the rollout path tells the router each request's prompt length,
the run reads each vLLM server's prefix-cache size from its ``/metrics`` into the router, and every
step reports the routing it did (``routing/moves``, ``routing/sticky``, ``routing/held_tokens_max``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClient, FakeTrainer, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward
from test_routing import run_five_turns_placed_on_server_1

from telescope.core.cluster.run_secret import ENV_VAR
from telescope.core.inference.transformers_engine.engine import TransformersEngine
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.rollouts.routing import Router
from telescope.core.runtime.assemble import build_router
from telescope.core.testing import make_config

#: An excerpt of a real vLLM 0.32 server's /metrics (CPU build; its log: "CPU KV cache size: 1,048,576 tokens").
VLLM_METRICS = (Path(__file__).parents[1] / "data" / "vllm_0.32_cpu_metrics.txt").read_text()
VLLM_TOKENS = 1_048_576


def test_every_request_tells_the_router_its_prompt_length(tokenizer: Any) -> None:
    """While each of a 5-turn rollout's requests is on its server, that server holds the request's
    prompt (what the client received), not 0 and not the first turn's."""
    router = Router(2, "sticky_least_loaded", saturation_margin=1, cache_tokens=10_000)
    held: list[tuple[int, int]] = []

    def reply(prompt: list[int], rid: str) -> list[int]:
        held.append((router.held_tokens(1), len(prompt)))
        return tokenizer.encode("ok", add_special_tokens=False)

    clients = [FakeClient(reply) for _ in range(2)]
    sample = run_five_turns_placed_on_server_1(tokenizer, router, clients)
    assert sample.num_turns == 5 and len(held) == 5
    assert [h for h, _ in held] == [len(r["prompt"]) for r in clients[1].requests]
    assert all(h == n for h, n in held) and held[-1][0] > held[0][0] > 0  # the conversation grows
    assert router.held_tokens(1) == 0 and (router.moves, router.sticky) == (0, 5)  # released


class _Metrics(BaseHTTPRequestHandler):
    texts: dict[str, str] = {}  # path -> /metrics text

    def do_GET(self) -> None:  # http.server's name
        seen.append(self.headers.get("Authorization", ""))
        body = self.texts[self.path.split("/metrics")[0]].encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


seen: list[str] = []


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Hook:
    """The run hooks ``build_router`` calls."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.info: dict[str, Any] = {}

    def telescope_warning(self, message: str) -> None:
        self.warnings.append(message)

    def telescope_run_info(self, info: dict[str, Any]) -> None:
        self.info.update(info)


def test_each_vllm_servers_cache_size_reaches_the_router(
    metrics_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server 0 answers as vLLM 0.32 did (its own ``kv_cache_size_tokens``), server 1 as an older vLLM
    (no ``kv_cache_size_tokens``: 2,048 blocks x 32 tokens), server 2 cannot be reached (None: load alone,
    with a warning naming it)."""
    monkeypatch.setenv(ENV_VAR, "s" * 40)
    older = VLLM_METRICS.replace('kv_cache_size_tokens="1048576"', 'kv_cache_size_tokens="None"')
    _Metrics.texts = {
        "/a": VLLM_METRICS,
        "/b": older.replace('num_gpu_blocks="32768"', 'num_gpu_blocks="2048"'),
    }
    urls = [f"{metrics_url}/a", f"{metrics_url}/b", "http://127.0.0.1:9"]
    cfg = make_config(routing_policy="sticky_least_loaded", routing_saturation_margin=3)
    hook = Hook()
    router = asyncio.run(build_router(cfg, VllmEngine.prefix_cache_in_metrics, urls, lambda i: True, hook))  # type: ignore[arg-type]
    assert router.cache_tokens == [VLLM_TOKENS, 2_048 * 32, None]
    assert (router.policy, router.saturation_margin, router.num_servers) == ("sticky_least_loaded", 3, 3)
    assert hook.info == {
        "routing": {"policy": "sticky_least_loaded", "cache_tokens": [VLLM_TOKENS, 65_536, None]}
    }
    assert len(hook.warnings) == 1 and "server 2 (http://127.0.0.1:9)" in hook.warnings[0]
    assert seen[-1] == f"Bearer {'s' * 40}"  # /metrics of a run's vLLM answers only with its secret


def test_no_cache_size_for_the_transformers_engine_or_other_policies(metrics_url: str) -> None:
    """The transformers engine keeps no prefix cache: nothing is read, the load-only rule applies."""
    _Metrics.texts = {"/a": VLLM_METRICS}
    seen.clear()
    for engine, policy in [
        (TransformersEngine, "sticky_least_loaded"),
        (VllmEngine, "sticky"),
        (VllmEngine, "pinned"),
    ]:
        hook = Hook()
        cfg = make_config(routing_policy=policy)
        router = asyncio.run(
            build_router(cfg, engine.prefix_cache_in_metrics, [f"{metrics_url}/a"], lambda i: True, hook)
        )  # type: ignore[arg-type]
        assert router.cache_tokens == [None] and hook.info["routing"]["cache_tokens"] is None
    assert not seen  # no request made


@pytest.mark.timeout(120)
def test_every_step_reports_its_routing(tokenizer: Any) -> None:
    """A 3-step run over 2 servers: each step's ``routing/sticky`` + ``routing/moves`` are the requests
    routed since the previous step, and over the run every request the servers answered is counted."""
    reply = varied_reply(tokenizer)  # rewards that differ within a group: every group trains
    clients = [FakeClient(reply), FakeClient(reply)]
    orch, trainer, recorder = build(tokenizer, ToyEnv(varied_reward), clients)
    router = Router(2, "sticky_least_loaded", saturation_margin=8, cache_tokens=[4_096, 4_096])
    orch.runner.route_requests(router, orch.clients)
    counts = asyncio.run(orch.run())
    assert counts.completed_steps == 3 and isinstance(trainer, FakeTrainer)
    steps = recorder.steps
    assert len(steps) == 3 and all(
        {"routing/moves", "routing/sticky", "routing/held_tokens_max"} <= set(m) for m in steps
    )
    answered = sum(len(c.requests) for c in clients)
    routed = sum(m["routing/sticky"] + m["routing/moves"] for m in steps) + sum(router.take_counts())
    assert answered == routed and answered >= 3 * 2 * 4  # 2 groups of 4 per step at least
    assert all(m["routing/moves"] == 0 for m in steps)  # single-turn: every request stays with its group
    assert steps[0]["routing/sticky"] >= 8
