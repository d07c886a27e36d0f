"""The vllm engine without vLLM: launch arguments from the resolved config, and its client against a
fake server that speaks vLLM's JSON. vLLM itself cannot run on CPU CI (see vllm_engine's docstring)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from telescope.core.inference.auto import resolve_inference_engine
from telescope.core.inference.protocol import WeightSyncInitRequest
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.args import WORKER_EXTENSION, build_vllm_args, build_vllm_env
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.inference.vllm_engine.guard import RPC_PATH
from telescope.core.weights import WeightSyncMismatchError
from telescope.core.weights.group import free_port

from .conftest import make_cfg

GROUP = "telescope-weights-" + "7" * 32


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_launch_args_come_from_the_resolved_config() -> None:
    cfg = make_cfg(
        model="org/some-model",
        inference_num_workers=4,
        inference_tensor_parallel_size=2,
        gpu_memory_utilization=0.55,
        max_model_len=2048,
        vllm_scheduling_policy="fcfs",
        enable_vllm_tracing=True,
        otlp_receiver_port=4999,
        model_dtype="bfloat16",
        seed=11,
        inference_dtype=None,
    )
    kwargs = VllmEngineKwargs(max_num_seqs=128, extra_args=["--enforce-eager"])
    args = build_vllm_args(
        cfg,
        kwargs,
        model_path="/models/m",
        index=3,
        host="0.0.0.0",
        port=8103,
        otlp_endpoint="http://10.0.0.9:4999/v1/traces",
    )
    assert args[0] == "/models/m"
    expected = {
        "--tensor-parallel-size": "2",
        "--gpu-memory-utilization": "0.55",
        "--max-model-len": "2048",
        "--scheduling-policy": "fcfs",
        "--otlp-traces-endpoint": "http://10.0.0.9:4999/v1/traces",
        "--logprobs-mode": "processed_logprobs",
        "--dtype": "bfloat16",
        "--seed": "14",
        "--port": "8103",
        "--host": "0.0.0.0",
        "--served-model-name": "org/some-model",
        "--worker-extension-cls": WORKER_EXTENSION,
        "--generation-config": "vllm",
        "--max-num-seqs": "128",
    }
    assert {k: flag(args, k) for k in expected} == expected
    assert "--enable-prefix-caching" in args and args[-1] == "--enforce-eager"
    assert "--max-num-batched-tokens" not in args
    env = build_vllm_env(cfg)
    assert env["VLLM_SERVER_DEV_MODE"] == "0" and env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert flag(args, "--middleware") == "telescope.core.inference.vllm_engine.guard.TelescopeGuard"


def test_defaults_follow_the_seed_table_and_tracing_off_drops_the_endpoint() -> None:
    cfg = make_cfg(enable_vllm_tracing=False)
    args = build_vllm_args(cfg, VllmEngineKwargs(), model_path="m", index=0, host="h", port=1)
    assert flag(args, "--gpu-memory-utilization") == "0.9" and flag(args, "--max-model-len") == "512"
    assert flag(args, "--scheduling-policy") == "priority" and flag(args, "--tensor-parallel-size") == "1"
    assert (
        "--otlp-traces-endpoint" not in args
        and "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in build_vllm_env(cfg)
    )


def test_uvicorn_access_log_is_off_unless_inference_access_log() -> None:
    quiet = build_vllm_args(make_cfg(), VllmEngineKwargs(), model_path="m", index=0, host="h", port=1)
    loud = build_vllm_args(
        make_cfg(inference_access_log=True), VllmEngineKwargs(), model_path="m", index=0, host="h", port=1
    )
    assert "--disable-uvicorn-access-log" in quiet and "--disable-uvicorn-access-log" not in loud
    with pytest.raises(ValueError, match="--disable-uvicorn-access-log"):  # set by the config field only
        VllmEngine(make_cfg(), VllmEngineKwargs(extra_args=["--disable-uvicorn-access-log"]))


def test_settings_vllm_cannot_honour_are_rejected() -> None:
    with pytest.raises(ValueError, match="top_p: 0.9 .* set top_p: null"):
        VllmEngine(make_cfg(top_p=0.9), VllmEngineKwargs())
    with pytest.raises(ValueError, match="--max-model-len"):
        VllmEngine(make_cfg(), VllmEngineKwargs(extra_args=["--max-model-len=99"]))


def test_server_command_uses_the_vllm_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import telescope.core.inference.vllm_engine.engine as engine_mod

    monkeypatch.setattr(engine_mod, "vllm_executable", lambda: "/venv/bin/vllm")
    engine = VllmEngine(
        make_cfg(model="org/m", inference_num_workers=4, inference_tensor_parallel_size=2), VllmEngineKwargs()
    )
    command = engine.server_command(1, "0.0.0.0", 8101, "/run/resolved.json")
    supervisor, served = (
        command.argv[: command.argv.index("--")],
        command.argv[command.argv.index("--") + 1 :],
    )
    assert supervisor[1:3] == ["-m", "telescope.core.inference.supervise"]  # ends vllm if the launcher dies
    assert served[:3] == ["/venv/bin/vllm", "serve", "org/m"] and engine.num_servers == 2
    assert (
        command.url == "http://127.0.0.1:8101"
        and command.env["TELESCOPE_RESOLVED_CONFIG"] == "/run/resolved.json"
    )


def test_transformers_engine_rejects_tensor_parallelism() -> None:
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine

    with pytest.raises(ValueError, match="inference_tensor_parallel_size: 2 .* set it to 1"):
        TransformersEngine(
            make_cfg(inference_num_workers=2, inference_tensor_parallel_size=2), TransformersEngineKwargs()
        )


@pytest.mark.parametrize(
    ("requested", "vllm", "gpu", "chosen", "why"),
    [
        ("auto", True, True, "vllm", "vllm importable"),
        ("auto", True, False, "transformers", "no CUDA GPU"),
        ("auto", False, False, "transformers", "no CUDA GPU and vllm is not installed"),
        ("transformers", True, True, "transformers", "set in the config"),
    ],
)
def test_auto_resolution(requested: str, vllm: bool, gpu: bool, chosen: str, why: str) -> None:
    engine, reason = resolve_inference_engine(requested, has_vllm=lambda: vllm, has_gpu=lambda: gpu)
    assert engine == chosen and why in reason


def test_registry_lists_both_engines() -> None:
    from telescope.core.plugins import load_plugins

    _, registry = load_plugins()
    assert {"transformers", "vllm"} <= set(registry.names("inference_engine"))
    engine = registry.create("inference_engine", "transformers", {"max_num_seqs": 4}, cfg=make_cfg())
    assert engine.kwargs.max_num_seqs == 4 and engine.num_servers == 2


class FakeVllm:
    """Answers like vLLM 0.33's OpenAI server in dev mode (JSON shapes from its protocol models)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_rpc = False
        self.worker1_fingerprints: dict[str, str] | None = None  # set: TP worker 1 received other bytes

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        for path in ("/pause", "/resume", "/abort_requests"):
            app.router.add_post(path, self.control)
        app.router.add_post(RPC_PATH, self.rpc)
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(
            f"completions n={body['n']} logprobs={body['logprobs']} ids={body['return_token_ids']}"
        )
        choices = [
            {
                "index": i,
                "text": "ab",
                "token_ids": [10 + i, 11],
                "prompt_token_ids": body["prompt"],
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {
                    "text_offset": [0, 1],
                    "token_logprobs": [-0.5, -1.5],
                    "tokens": ["a", "b"],
                    "top_logprobs": None,
                },
            }
            for i in reversed(range(body["n"]))
        ]
        usage = {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": choices,
                "usage": usage,
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# HELP vllm:num_requests_running Number of requests\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        )
        return web.Response(text=text)

    async def control(self, request: web.Request) -> web.Response:
        query = "&".join(f"{k}={v}" for k, v in request.query.items())
        self.calls.append(request.path + (f"?{query}" if query else ""))
        return web.json_response({})

    async def rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(f"rpc {body['method']} {body['args']}")
        if self.fail_rpc:
            message = (
                "WeightSyncMismatchError: weight sync verification failed (transport): 1 tensor(s) differ: x"
            )
            return web.json_response(
                {"error": {"message": message, "type": "Internal Server Error"}}, status=500
            )
        if body["method"] == "telescope_update_weights":
            result = {
                "version": int(body["args"][0]),
                "num_tensors": 5,
                "fingerprints": {"w": "float32:2:ab"},
            }
            second = dict(result)
            if self.worker1_fingerprints is not None:
                second["fingerprints"] = self.worker1_fingerprints
            return web.json_response({"results": [result, second]})
        return web.json_response({"results": [{"rank": 1}, {"rank": 2}]})


@pytest.mark.parametrize("pause_clear_cache", [False, True])
def test_vllm_client_against_a_fake_vllm_server(pause_clear_cache: bool) -> None:
    fake = FakeVllm()

    async def go():  # type: ignore[no-untyped-def]
        runner = web.AppRunner(fake.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        engine = VllmEngine(make_cfg(), VllmEngineKwargs(pause_clear_cache=pause_clear_cache))
        try:
            async with engine.client(f"http://127.0.0.1:{port}") as client:
                out = await client.complete([1, 2], n=2, max_tokens=2)
                metrics = await client.metrics()
                await client.init_weight_sync(
                    WeightSyncInitRequest(host="127.0.0.1", port=5, world_size=3, rank=1, group_name=GROUP)
                )
                update = await client.update_weights(4)
                fake.fail_rpc = True
                with pytest.raises(WeightSyncMismatchError, match="verification failed"):
                    await client.update_weights(5)
                return out, metrics, update
        finally:
            await runner.cleanup()

    out, metrics, update = asyncio.run(go())
    assert [(c.index, c.token_ids, c.logprobs) for c in out] == [
        (0, [10, 11], [-0.5, -1.5]),
        (1, [11, 11], [-0.5, -1.5]),
    ]
    assert metrics["num_requests_running"] == 3 and metrics["kv_cache_usage_perc"] == 0.25
    assert update.version == 4 and update.fingerprints == {"w": "float32:2:ab"}
    assert fake.calls[0] == "completions n=2 logprobs=0 ids=True"
    assert fake.calls[1].startswith("rpc telescope_init_weight_sync")
    updates = ["rpc telescope_update_weights ['4']", "rpc telescope_update_weights ['5']"]
    if pause_clear_cache:  # then every update is wrapped in pause / resume, also when the worker raises
        pause = "/pause?mode=keep&clear_cache=true"
        assert fake.calls[2:] == [pause, updates[0], "/resume", pause, updates[1], "/resume"]
    else:  # vLLM runs the worker call between two steps: a pause that keeps the KV would change nothing
        assert fake.calls[2:] == updates


def _serve_fake(fake: FakeVllm):  # type: ignore[no-untyped-def]
    """Start ``fake`` on a free port; returns (runner, url)."""

    async def start():  # type: ignore[no-untyped-def]
        runner = web.AppRunner(fake.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"

    return start()


def test_vllm_client_checks_every_tp_worker_received_the_same_weights() -> None:
    fake = FakeVllm()

    async def go():  # type: ignore[no-untyped-def]
        runner, url = await _serve_fake(fake)
        try:
            async with VllmEngine(make_cfg(), VllmEngineKwargs()).client(url) as client:
                fake.worker1_fingerprints = {"w": "float32:2:ab"}  # same bytes on both workers: passes
                agreed = await client.update_weights(6)
                fake.worker1_fingerprints = {"w": "float32:2:cd"}
                with pytest.raises(WeightSyncMismatchError, match="TP worker 1") as info:
                    await client.update_weights(7)
                fake.worker1_fingerprints = {}
                with pytest.raises(WeightSyncMismatchError, match="missing on the receiving side: w"):
                    await client.update_weights(8)
                return agreed, info.value.tensors
        finally:
            await runner.cleanup()

    agreed, tensors = asyncio.run(go())
    assert agreed.version == 6 and agreed.fingerprints == {"w": "float32:2:ab"}
    assert tensors == ["w"]
    # no pause (pause_clear_cache false), so nothing to resume after the rejected ones
    assert fake.calls[-3:] == [f"rpc telescope_update_weights ['{v}']" for v in (6, 7, 8)]


def test_telescope_weight_api_against_a_vllm_server_says_which_client_to_use() -> None:
    from telescope.core.inference.client import InferenceClient
    from telescope.core.weights import WeightSyncError

    async def go() -> None:
        runner, url = await _serve_fake(FakeVllm())
        try:
            async with InferenceClient(url) as client:  # the transformers engine's weight API
                await client.init_weight_sync(
                    WeightSyncInitRequest(host="127.0.0.1", port=5, world_size=2, rank=1, group_name=GROUP)
                )
        finally:
            await runner.cleanup()

    with pytest.raises(WeightSyncError, match=r"engine.client\(url\) \(a VllmClient\)"):
        asyncio.run(go())


def test_worker_extension_reads_weight_sync_verify_from_the_resolved_config(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from telescope.core.inference.vllm_engine.worker import _verify_enabled

    engine = VllmEngine(make_cfg(weight_sync_verify=False), VllmEngineKwargs())
    monkeypatch.setenv("TELESCOPE_RESOLVED_CONFIG", engine.write_config(tmp_path / "off"))
    assert _verify_enabled() is False
    engine = VllmEngine(make_cfg(), VllmEngineKwargs())
    monkeypatch.setenv("TELESCOPE_RESOLVED_CONFIG", engine.write_config(tmp_path / "on"))
    assert _verify_enabled() is True


def test_each_engine_returns_its_own_client() -> None:
    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine
    from telescope.core.inference.vllm_engine.client import VllmClient

    assert type(VllmEngine(make_cfg(), VllmEngineKwargs()).client("http://h:1")) is VllmClient
    assert (
        type(TransformersEngine(make_cfg(), TransformersEngineKwargs()).client("http://h:1"))
        is InferenceClient
    )


def test_the_small_test_engine_is_one_eager_tiny_server_and_takes_overrides() -> None:
    from telescope.core.testing import small_vllm_engine

    engine = small_vllm_engine(lora_rank=8)
    args = build_vllm_args(engine.cfg, engine.kwargs, model_path="m", index=0, host="h", port=1)
    assert engine.cfg.lora_rank == 8 and engine.cfg.inference_num_workers == 1
    assert flag(args, "--max-model-len") == "512" and flag(args, "--gpu-memory-utilization") == "0.3"
    assert "--enforce-eager" in args and "--enable-lora" in args
