"""Master weights stay float32; servers run and weights travel in the serving dtype (cast on the sender)."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from telescope.core.inference.auto import startup_notes
from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.args import build_vllm_args
from telescope.core.testing import make_config
from telescope.core.weights.fingerprint import fingerprint
from telescope.core.weights.group import free_port
from telescope.core.weights.settings import WeightSyncSettings, serving_dtype

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import the worker by module name
workers = importlib.import_module("dtype_workers")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "bfloat16"),  # model_dtype float32 master, mixed_precision_dtype bfloat16 compute
        ({"mixed_precision_dtype": None}, "float32"),  # no mixed precision: the model dtype
        ({"mixed_precision_dtype": "float16"}, "float16"),
        ({"inference_dtype": "float32"}, "float32"),  # asked for explicitly
    ],
)
def test_serving_dtype_defaults_to_the_compute_dtype(fields: dict[str, str | None], expected: str) -> None:
    cfg = make_config(**fields)
    assert serving_dtype(cfg) == expected
    assert WeightSyncSettings.from_config(cfg).dtype == expected
    args = build_vllm_args(cfg, VllmEngineKwargs(), model_path="m", index=0, host="h", port=1)
    assert args[args.index("--dtype") + 1] == expected


def test_the_receiver_gets_bf16_tensors_equal_to_the_cast_master_weights() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = mp.start_processes(
        workers.cast_worker, args=(free_port(), "bfloat16", queue), nprocs=2, start_method="spawn", join=False
    )
    items = {item[0]: item[1:] for item in (queue.get(timeout=120) for _ in range(2))}  # read before joining
    assert procs is not None
    while not procs.join():  # returns once per exited process
        pass
    sent_bytes, sent_fps = items["sent"]
    got_blob, got_fps = items["got"]
    got = pickle.loads(got_blob)
    master = dict(workers.master_weights())
    for name, tensor in master.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert got[name].dtype == expected.dtype, name
        assert torch.equal(got[name], expected), name
    # The cast is real: norm.weight's 1e-3 wiggles round away in bf16 (so master weights must stay fp32).
    assert not torch.equal(got["norm.weight"].float(), master["norm.weight"])
    # Half the float bytes on the wire; both ends fingerprint what travelled.
    floats = sum(t.numel() for t in master.values() if t.is_floating_point())
    assert sent_bytes == floats * 2 + master["positions"].numel() * 8
    assert sent_fps == got_fps == {n: fingerprint(t) for n, t in got.items()}


def test_startup_summary_names_the_dtypes_and_warns_on_bf16_master() -> None:
    notes = startup_notes(make_config(), "transformers")
    assert any(
        "master weights float32" in n and "compute bfloat16" in n and "servers and weight sync bfloat16" in n
        for n in notes
    ), notes
    warned = startup_notes(make_config(model_dtype="bfloat16"), "transformers")
    assert any(
        "model_dtype: bfloat16 keeps the master weights" in n and "set model_dtype: float32" in n
        for n in warned
    ), warned
    assert not any("keeps the master weights" in n for n in notes)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "mixed_precision_dtype bfloat16 and inference_dtype bfloat16"),  # the seed's defaults
        ({"inference_dtype": "float32"}, "mixed_precision_dtype bfloat16 on"),  # trains in bf16, serves fp32
        ({"mixed_precision_dtype": None, "inference_dtype": "float16"}, "inference_dtype float16 on"),
        ({"mixed_precision_dtype": None}, None),  # float32 throughout: nothing to say
        # no mixed precision: the master dtype computes, and the note names that field
        (
            {"mixed_precision_dtype": None, "model_dtype": "bfloat16"},
            "model_dtype bfloat16 and inference_dtype",
        ),
    ],
)
def test_a_cpu_run_in_16_bit_dtypes_is_told_to_use_float32(
    fields: dict[str, str | None], named: str | None
) -> None:
    cfg = make_config(**fields)
    cpu = [n for n in startup_notes(cfg, "transformers", has_gpu=lambda: False) if "without a CUDA GPU" in n]
    if named is None:
        assert cpu == []
    else:
        assert len(cpu) == 1 and named in cpu[0] and "set mixed_precision_dtype: null" in cpu[0], cpu
    # with a GPU, or on vLLM (GPU-only), 16-bit dtypes are the fast ones: no such note
    assert not any(
        "without a CUDA GPU" in n for n in startup_notes(cfg, "transformers", has_gpu=lambda: True)
    )
    assert not any("without a CUDA GPU" in n for n in startup_notes(cfg, "vllm", has_gpu=lambda: False))
