"""LoRA on the vllm engine (issue #31), without vLLM: the launch flags, the adapter's names as vLLM
reads them, the PEFT folder the worker extension writes, the guard's in-place reload and the client's
sequence around a sync. vLLM itself is replaced at its boundary by fakes named as such (``vllm.distributed``
for the worker, ``FakeServingModels`` for ``OpenAIServingModels``, ``FakeLoraVllm`` for the server);
what they mimic is checked against vLLM 0.17.1's source in test_vllm_contract.py. A real vLLM run is
``test_gpu.py::test_vllm_serves_the_synced_lora_adapter`` (GPU only).
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from aiohttp import web
from safetensors.torch import load_file

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.args import (
    LORA_ADAPTER_NAME,
    LORA_DIR_ENV,
    build_vllm_args,
    vllm_max_lora_rank,
)
from telescope.core.inference.vllm_engine.engine import VllmEngine
from telescope.core.inference.vllm_engine.guard import LORA_LOAD_PATH
from telescope.core.inference.vllm_engine.lora import (
    adapter_config,
    adapter_target_modules,
    prune_adapters,
    vllm_lora_module,
    write_adapter,
)
from telescope.core.inference.vllm_engine.worker import TelescopeWeightSyncExtension
from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.group import free_port
from telescope.core.weights.receiver import ReceivedSync

from .conftest import FakeVllmReload, make_cfg
from .test_vllm_guard import AUTH, JSON, serve
from .test_weight_apply import FakeVllmWorkers

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
DOWN_B = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"


def _args(**overrides: Any) -> list[str]:
    return build_vllm_args(
        make_cfg(**overrides), VllmEngineKwargs(), model_path="/m", index=0, host="h", port=1
    )


# -- launch ------------------------------------------------------------------------------------------


def test_full_runs_launch_without_lora() -> None:
    assert not [a for a in _args() if "lora" in a]


@pytest.mark.parametrize(
    ("rank", "max_rank"), [(1, "1"), (4, "8"), (8, "8"), (9, "16"), (300, "320"), (512, "512")]
)
def test_lora_runs_launch_with_one_adapter_slot_of_the_smallest_rank_vllm_accepts(
    rank: int, max_rank: str
) -> None:
    args = _args(lora_rank=rank)
    at = args.index("--enable-lora")
    assert args[at : at + 7] == [
        "--enable-lora",
        "--max-lora-rank",
        max_rank,
        "--max-loras",
        "1",
        "--max-cpu-loras",
        "1",
    ]


def test_a_rank_vllm_cannot_serve_is_refused_naming_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"lora_rank: 513 with inference_engine vllm.*set lora_rank <= 512"):
        VllmEngine(make_cfg(lora_rank=513), VllmEngineKwargs())
    with pytest.raises(ValueError, match="--max-lora-rank"):
        VllmEngine(make_cfg(lora_rank=8), VllmEngineKwargs(extra_args=["--max-lora-rank=64"]))
    assert vllm_max_lora_rank(16) == 16


def test_the_engine_gives_each_lora_server_an_adapter_folder_and_its_client_the_adapter_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from telescope.core.inference.vllm_engine import engine as engine_module

    monkeypatch.setattr(engine_module, "vllm_executable", lambda: "/bin/vllm")
    config = str(tmp_path / "resolved.json")
    lora = VllmEngine(make_cfg(lora_rank=4), VllmEngineKwargs())
    assert lora.server_command(2, "127.0.0.1", 8000, config).env[LORA_DIR_ENV] == str(
        tmp_path / "vllm-lora-2"
    )
    assert lora.client("http://x").lora_name == LORA_ADAPTER_NAME
    full = VllmEngine(make_cfg(), VllmEngineKwargs())
    assert LORA_DIR_ENV not in full.server_command(0, "127.0.0.1", 8000, config).env
    assert full.client("http://x").lora_name is None


# -- names and the adapter folder ---------------------------------------------------------------------


def test_peft_names_become_the_modules_vllm_attaches_them_to() -> None:
    assert vllm_lora_module(Q_A) == ("model.layers.0.self_attn.q_proj", True)
    assert vllm_lora_module(DOWN_B) == ("model.layers.1.mlp.down_proj", False)
    assert vllm_lora_module("base_model.model.model.embed_tokens.lora_embedding_A") == (
        "model.embed_tokens",
        True,
    )
    assert vllm_lora_module("model.layers.0.self_attn.q_proj.lora_B.weight") == (
        "model.layers.0.self_attn.q_proj",
        False,
    )
    assert adapter_target_modules([Q_A, Q_B, DOWN_B]) == ["down_proj", "q_proj"]
    for bad in ("base_model.model.model.layers.0.self_attn.q_proj.weight", "base_model.model.lm_head.weight"):
        with pytest.raises(ValueError, match=f"weight sync sent '{bad}' to a LoRA server"):
            vllm_lora_module(bad)


def test_the_trainers_adapter_names_map_to_the_modules_peft_wrapped(tiny_path: str) -> None:
    from transformers import AutoModelForCausalLM

    from telescope.core.weights.lora import adapter_parameters, inject_lora

    model = inject_lora(AutoModelForCausalLM.from_pretrained(tiny_path), make_cfg(lora_rank=4))
    wrapped = {name for name, module in model.named_modules() if hasattr(module, "lora_A")}
    names = list(adapter_parameters(model))
    assert {vllm_lora_module(n)[0] for n in names} == wrapped
    assert sum(vllm_lora_module(n)[1] for n in names) == len(wrapped)  # one lora_A per module


def test_the_written_folder_is_a_peft_adapter_of_the_run(tiny_path: str, tmp_path: Path) -> None:
    """peft itself loads what the worker writes, and gets the tensors that were synced."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from telescope.core.weights.lora import adapter_parameters, inject_lora

    cfg = make_cfg(lora_rank=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj"])
    trained = inject_lora(AutoModelForCausalLM.from_pretrained(tiny_path), cfg)
    tensors = {n: torch.randn_like(p) for n, p in adapter_parameters(trained).items()}
    path = write_adapter(tmp_path, 3, tensors, adapter_config(cfg.to_dict(), tensors))
    assert path == str(tmp_path / "v3") and sorted(p.name for p in tmp_path.iterdir()) == ["v3"]
    config = json.loads((tmp_path / "v3" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["q_proj", "v_proj"])
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), path)
    state = {k.replace(".default", ""): v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert sorted(state) == sorted(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(state[name], tensor), name


def test_prune_keeps_only_the_versions_asked_for(tmp_path: Path) -> None:
    for v in (1, 2, 3):
        write_adapter(tmp_path, v, {Q_A: torch.zeros(2, 4)}, {"r": 2})
    (tmp_path / "notes").mkdir()
    prune_adapters(tmp_path, keep={2, 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v2", "v3"]


# -- the worker extension -----------------------------------------------------------------------------


class FakeAdapterReceiver:
    """Stands in for ``WeightReceiver``: each sync yields adapter tensors filled with its version."""

    def __init__(self, extra: str | None = None) -> None:
        self.version = 0
        self.extra = extra
        self.last_sync: ReceivedSync | None = None

    def receive(self, expect_version: int | None = None) -> Any:
        self.version += 1
        assert expect_version == self.version
        names = [Q_A, Q_B] + ([self.extra] if self.extra else [])
        yield from ((n, torch.full((2, 2), float(self.version))) for n in names)
        self.last_sync = ReceivedSync(self.version, len(names), {n: f"fp{self.version}" for n in names})


def _install_fake_vllm_distributed(monkeypatch: pytest.MonkeyPatch, tp_rank: int) -> None:
    """Fake of ``vllm.distributed`` (not importable on CPU CI): this worker's tensor-parallel rank."""
    vllm = types.ModuleType("vllm")
    distributed = types.ModuleType("vllm.distributed")
    distributed.get_tensor_model_parallel_rank = lambda: tp_rank  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", distributed)


def _lora_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: str | None = None
) -> TelescopeWeightSyncExtension:
    config = tmp_path / "resolved.json"
    config.write_text(json.dumps(make_cfg(lora_rank=2, lora_alpha=4.0).to_dict(), default=str))
    monkeypatch.setenv("TELESCOPE_RESOLVED_CONFIG", str(config))
    monkeypatch.setenv(LORA_DIR_ENV, str(tmp_path / "adapters"))
    worker = TelescopeWeightSyncExtension()
    worker.model_runner = SimpleNamespace(model=None)  # a LoRA sync never touches the base model
    worker._telescope_receiver = FakeAdapterReceiver(extra)  # type: ignore[attr-defined]
    return worker


def test_the_worker_writes_each_sync_as_a_peft_folder_and_keeps_the_served_and_the_new_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install_fake_vllm_distributed(monkeypatch, tp_rank=0)
    worker = _lora_worker(monkeypatch, tmp_path)
    root = tmp_path / "adapters"
    for version in (1, 2, 3):
        out = worker.telescope_update_weights(str(version), "true")
        assert out["adapter_path"] == str(root / f"v{version}") and out["version"] == version
        written = load_file(str(root / f"v{version}" / "adapter_model.safetensors"))
        assert sorted(written) == [Q_A, Q_B] and torch.equal(written[Q_A], torch.full((2, 2), float(version)))
    assert sorted(p.name for p in root.iterdir()) == ["v2", "v3"]
    config = json.loads((root / "v3" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (2, 4.0, ["q_proj"])
    out = worker.telescope_update_weights("4", "false")  # received, not applied: nothing written
    assert "adapter_path" not in out and out["version"] == 3 and not (root / "v4").exists()


def test_only_tp_worker_0_writes_and_every_worker_names_the_same_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install_fake_vllm_distributed(monkeypatch, tp_rank=1)
    out = _lora_worker(monkeypatch, tmp_path).telescope_update_weights("1", "true")
    assert out["adapter_path"] == str(tmp_path / "adapters" / "v1")
    assert not (tmp_path / "adapters").exists()


def test_a_base_weight_in_a_lora_sync_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install_fake_vllm_distributed(monkeypatch, tp_rank=0)
    worker = _lora_worker(monkeypatch, tmp_path, extra="model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj.weight' to a LoRA server"):
        worker.telescope_update_weights("1", "true")
    assert not (tmp_path / "adapters" / "v1").exists()


# -- the guard's reload ------------------------------------------------------------------------------


class FakeServingModels:
    """Fake of vLLM 0.17.1's ``OpenAIServingModels`` LoRA bookkeeping: ``load_lora_adapter`` refuses a
    known name without ``load_inplace``, keeps the id of a known name, stores the request it loaded."""

    def __init__(self, fail: str | None = None) -> None:
        self.lora_requests: dict[str, Any] = {}
        self.loads: list[tuple[str, str, bool]] = []
        self.fail = fail

    async def load_lora_adapter(self, request: Any) -> Any:
        self.loads.append((request.lora_name, request.lora_path, request.load_inplace))
        if self.fail is not None:
            return SimpleNamespace(error=SimpleNamespace(message=self.fail))
        if request.lora_name in self.lora_requests and not request.load_inplace:
            return SimpleNamespace(error=SimpleNamespace(message="already loaded"))
        known = self.lora_requests.get(request.lora_name)
        lora_id = known.lora_int_id if known else len(self.lora_requests) + 1
        self.lora_requests[request.lora_name] = SimpleNamespace(
            lora_name=request.lora_name,
            lora_int_id=lora_id,
            lora_path=request.lora_path,
            load_inplace=request.load_inplace,
        )
        return f"Success: LoRA adapter '{request.lora_name}' added successfully."


async def _answer(value: Any) -> Any:
    return value


def _guard_post(models: Any, path: str, payload: Any) -> tuple[int, dict[str, Any]]:
    status, answer, _, reached = serve(
        "POST", path, {**AUTH, **JSON}, json.dumps(payload).encode(), serving_models=models
    )
    assert not reached  # the guard serves this route itself
    return status, answer


def test_the_guard_reloads_the_adapter_in_place_under_one_name_and_id() -> None:
    models = FakeServingModels()
    for version in (1, 2):
        status, answer = _guard_post(
            models, LORA_LOAD_PATH, {"lora_name": "telescope-lora", "lora_path": f"/a/v{version}"}
        )
        assert status == 200 and answer["lora_int_id"] == 1
    assert models.loads == [("telescope-lora", "/a/v1", True), ("telescope-lora", "/a/v2", True)]
    # vLLM's worker reloads from disk at every step while the adapter's request says load_inplace
    assert models.lora_requests["telescope-lora"].load_inplace is False
    assert models.lora_requests["telescope-lora"].lora_path == "/a/v2"


def test_the_guard_reports_vllms_refusal_and_bad_bodies() -> None:
    status, answer = _guard_post(
        FakeServingModels(fail="LoRA rank 4 is greater than max_lora_rank 1."),
        LORA_LOAD_PATH,
        {"lora_name": "n", "lora_path": "/p"},
    )
    assert (
        status == 500 and "vLLM refused LoRA adapter 'n' from /p: LoRA rank 4 is greater" in answer["error"]
    )
    ignored = FakeServingModels()
    ignored.lora_requests["n"] = SimpleNamespace(lora_path="/old", lora_int_id=1, load_inplace=False)
    ignored.load_lora_adapter = lambda request: _answer("Success")  # type: ignore[method-assign]
    status, answer = _guard_post(ignored, LORA_LOAD_PATH, {"lora_name": "n", "lora_path": "/p"})
    assert status == 500 and "serves LoRA adapter 'n' from '/old', not '/p'" in answer["error"]
    status, answer = _guard_post(FakeServingModels(), LORA_LOAD_PATH, {"lora_name": "n"})
    assert status == 400 and "'lora_path': str" in answer["error"]


# -- the client around a sync -------------------------------------------------------------------------


class FakeLoraVllm(FakeVllmWorkers):
    """Fake vLLM server for a LoRA run: the RPC runs the real worker extension (fake receiver), the
    load route reads the folder it names, as vLLM's loader does; a completion's text says what it
    was sampled with: ``base``, or the adapter's value (every synced tensor is filled with its version)."""

    def __init__(self, worker: TelescopeWeightSyncExtension) -> None:
        super().__init__()
        self.workers = [worker]
        self.adapter: dict[str, torch.Tensor] | None = None

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post(LORA_LOAD_PATH, self.load)
        return app

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(f"load {body['lora_name']} {Path(body['lora_path']).name}")
        self.adapter = load_file(str(Path(body["lora_path"]) / "adapter_model.safetensors"))
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("model") == LORA_ADAPTER_NAME:
            assert self.adapter is not None, "a request named the adapter before it was loaded"
            text = str(int(self.adapter[Q_A][0, 0]))
        else:
            text = "base"
        choice = {
            "index": 0,
            "text": text,
            "token_ids": [5],
            "prompt_token_ids": body["prompt"],
            "finish_reason": "stop",
            "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1], "text_offset": [0], "top_logprobs": None},
        }
        return web.json_response(
            {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
        )


def _run_client(fake: FakeLoraVllm, steps: Any, lora_name: str | None = LORA_ADAPTER_NAME) -> list[str]:
    async def go() -> list[str]:
        runner = web.AppRunner(fake.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            options = {"lora_name": lora_name} if lora_name else {}
            async with VllmEngine(make_cfg(), VllmEngineKwargs()).client(
                f"http://127.0.0.1:{port}", **options
            ) as client:
                return [r for r in [await step(client) for step in steps] if r is not None]
        finally:
            await runner.cleanup()

    return asyncio.run(go())


async def _text(client: Any) -> str:
    return str((await client.complete([1, 2]))[0].text)


def test_requests_name_the_adapter_from_its_first_load_and_each_sync_reloads_it_while_paused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install_fake_vllm_distributed(monkeypatch, tp_rank=0)
    fake = FakeLoraVllm(_lora_worker(monkeypatch, tmp_path))

    def sync(version: int, apply: bool = True) -> Any:
        async def step(client: Any) -> None:
            await client.update_weights(version, apply=apply)

        return step

    seen = _run_client(fake, [_text, sync(1), _text, sync(2), _text, sync(3, apply=False), _text])
    assert seen == ["base", "1", "2", "2"]
    assert fake.calls == [
        "/pause",
        "rpc telescope_update_weights ['1'] {'apply': 'true'}",
        "load telescope-lora v1",
        "/resume",
        "/pause",
        "rpc telescope_update_weights ['2'] {'apply': 'true'}",
        "load telescope-lora v2",
        "/resume",
        "rpc telescope_update_weights ['3'] {'apply': 'false'}",  # no pause, no reload
    ]


def test_a_lora_client_facing_a_server_that_wrote_no_adapter_fails_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The server's resolved config says full fine-tuning while the client serves an adapter."""
    _install_fake_vllm_distributed(monkeypatch, tp_rank=0)
    worker = _lora_worker(monkeypatch, tmp_path)
    (tmp_path / "resolved.json").write_text(json.dumps(make_cfg().to_dict(), default=str))
    worker.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda w: list(w)))
    worker.vllm_config, worker.model_config, worker.device = "VC", "MC", "cpu"
    FakeVllmReload().install(monkeypatch)
    _install_fake_vllm_distributed(monkeypatch, tp_rank=0)

    async def sync(client: Any) -> None:
        await client.update_weights(1)

    with pytest.raises(WeightSyncError, match="wrote no adapter.*lora_rank > 0"):
        _run_client(FakeLoraVllm(worker), [sync])
