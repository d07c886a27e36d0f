"""Inference-server and weight-broadcast fields of the run config reach the code that uses them.

The field-by-field mapping is in ``telescope.core.inference.settings``' docstring; the vLLM
launch arguments are checked in test_vllm_engine.py, bucket sizes and both modes on the wire in
test_weight_sync.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from telescope.core.weights.settings import WeightSyncSettings, choose_broadcast_host
from telescope.core.weights.wire import LayoutHistory, MetaCache

from .conftest import make_cfg


def test_weight_sync_settings_come_from_the_run_config() -> None:
    cfg = make_cfg(
        weight_broadcast_mode="per_tensor",
        weight_broadcast_bucket_mb=7,
        weight_broadcast_cpu_staging=True,
        weight_broadcast_pin_memory=False,
        weight_sync_verify=False,
        ray_broadcast_init_timeout_s=42,
    )
    settings = WeightSyncSettings.from_config(cfg)
    assert (settings.mode, settings.bucket_mb, settings.bucket_bytes) == ("per_tensor", 7, 7 * 1024 * 1024)
    assert (settings.cpu_staging, settings.pin_memory, settings.verify) == (True, False, False)
    # seed-table defaults
    default = WeightSyncSettings.from_config(make_cfg())
    assert (default.mode, default.bucket_mb, default.cpu_staging, default.pin_memory, default.verify) == (
        "flattened_bucket",
        256,
        False,
        True,
        True,
    )


def test_direct_tensor_threshold_never_exceeds_the_bucket() -> None:
    assert WeightSyncSettings(bucket_mb=256).direct_tensor_bytes() == 4 << 20
    assert WeightSyncSettings(bucket_mb=1).direct_tensor_bytes() == 1 << 20


@pytest.mark.parametrize(
    ("trainer", "servers", "prefer", "host"),
    [
        ("10.0.0.5", ["10.0.0.5", "10.0.0.5"], True, "127.0.0.1"),
        ("10.0.0.5", ["10.0.0.5", "10.0.0.5"], False, "10.0.0.5"),
        ("10.0.0.5", ["10.0.0.5", "10.0.0.6"], True, "10.0.0.5"),
    ],
)
def test_broadcast_host_prefers_loopback_only_on_one_node(
    trainer: str, servers: list[str], prefer: bool, host: str
) -> None:
    assert choose_broadcast_host(trainer, servers, prefer) == host


def _sender(device: str, **settings: Any):  # type: ignore[no-untyped-def]
    """A sender over a stand-in group (``_stage`` needs only the group's device)."""
    from telescope.core.weights.sender import WeightSender

    group = SimpleNamespace(
        rank=0, device=torch.device(device), meta_cache=MetaCache(), layouts=LayoutHistory()
    )
    return WeightSender(group, WeightSyncSettings(**settings))  # type: ignore[arg-type]


def test_gloo_staging_of_cpu_tensors_copies_only_to_make_them_contiguous() -> None:
    sender = _sender("cpu", cpu_staging=True, pin_memory=True)
    t = torch.randn(4, 6)
    staged = sender._stage(t)
    assert staged.data_ptr() == t.data_ptr() and not staged.is_pinned()  # nothing to pin for gloo
    transposed = sender._stage(t.t())
    assert transposed.is_contiguous() and torch.equal(transposed, t.t())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("group_device", "staging", "pin", "where", "pinned"),
    [
        ("cuda", True, True, "cpu", True),  # cpu_staging with NCCL: on CPU, pinned
        ("cuda", True, False, "cpu", False),
        ("cuda", False, True, "cuda", False),  # no staging: stays on the GPU
        ("cpu", False, True, "cpu", True),  # gloo always stages; pinned D2H
        ("cpu", False, False, "cpu", False),
    ],
)
def test_cpu_staging_and_pin_memory_on_cuda(
    group_device: str, staging: bool, pin: bool, where: str, pinned: bool
) -> None:
    sender = _sender(group_device, cpu_staging=staging, pin_memory=pin)
    t = torch.randn(33, 17, device="cuda")
    staged = sender._stage(t)
    assert staged.device.type == where and staged.is_pinned() is pinned
    assert torch.equal(staged.cpu(), t.cpu())


class _Recorder:
    """Stands in for ``ServerProcess``: records the command ``launch`` built, starts nothing."""

    def __init__(self, command: Any, log_path: Any) -> None:
        self.command, self.url, self.log_path = command, command.url, log_path


def test_launch_uses_inference_host_base_port_and_the_resolved_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telescope.core.inference.launcher as launcher
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.engine import TransformersEngine

    monkeypatch.setattr(launcher, "ServerProcess", _Recorder)
    cfg = make_cfg(inference_host="127.0.0.2", inference_base_port=9300, inference_num_workers=3)
    engine = TransformersEngine(cfg, TransformersEngineKwargs(max_num_seqs=5))
    server: Any = engine.launch(2, log_dir=str(tmp_path), wait=False)
    argv = server.command.argv
    assert argv[argv.index("--host") + 1] == "127.0.0.2" and argv[argv.index("--port") + 1] == "9302"
    assert server.url == "http://127.0.0.2:9302" and argv[argv.index("--index") + 1] == "2"
    assert json.loads(argv[argv.index("--engine-kwargs") + 1])["max_num_seqs"] == 5
    # the server process reads the whole resolved config, not packaged defaults
    written = json.loads(Path(argv[argv.index("--config") + 1]).read_text())
    assert written == cfg.to_dict() and written["max_model_len"] == 512


def test_port_beyond_65535_is_a_clear_error() -> None:
    from telescope.core.inference.settings import server_port

    with pytest.raises(ValueError, match="inference_base_port"):
        server_port(make_cfg(inference_base_port=65535), 1)


def test_transformers_threads_and_ignored_fields() -> None:
    from telescope.core.cluster.threads import choose_torch_threads
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import _notes, server_threads

    cfg = make_cfg(ray_inference_cpus_per_worker=3.5)
    # the engine kwarg wins over the run-wide rule; otherwise the rule decides
    assert server_threads(cfg, TransformersEngineKwargs(num_threads=5)).threads == 5
    assert server_threads(cfg, TransformersEngineKwargs()) == choose_torch_threads(cfg, "inference")
    notes = " ".join(_notes(make_cfg(enable_vllm_tracing=True), "cpu"))
    assert "gpu_memory_utilization" in notes and "enable_vllm_tracing" in notes
    assert _notes(make_cfg(enable_vllm_tracing=False), "cuda") == []


def test_max_model_len_beyond_the_model_positions_is_rejected(tiny_path: str) -> None:
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import load_server_state

    with pytest.raises(
        ValueError, match=r"max_model_len: 5000 exceeds the 4096 positions .* max_model_len <= 4096"
    ):
        load_server_state(make_cfg(max_model_len=5000), TransformersEngineKwargs(num_threads=1))
