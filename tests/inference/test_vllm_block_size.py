"""The KV-cache block size a vLLM server is launched with: on vLLM's CPU build 32 instead of its own 128,
so the samples of a GRPO group share their prompt's blocks (``vllm_engine.args.kv_block_size``).

vLLM reuses only whole cached blocks before a prompt's last token; the real server's hit counts are
checked in tests/runtime/test_vllm_cpu_observability.py (``vllm_cpu``).
"""

from __future__ import annotations

import pytest

from telescope.core.inference.settings import VllmEngineKwargs
from telescope.core.inference.vllm_engine.args import build_vllm_args, check_vllm_config, kv_block_size
from telescope.core.testing import make_config


def _launch_block_size(kwargs: VllmEngineKwargs, cpu_build: bool) -> int | None:
    args = build_vllm_args(
        make_config(), kwargs, model_path="m", index=0, host="127.0.0.1", port=1, cpu_build=cpu_build
    )
    if "--block-size" not in args:
        return None
    return int(args[args.index("--block-size") + 1])


def test_the_cpu_build_shares_the_blocks_of_a_quickstart_prompt() -> None:
    # vLLM's CPU default (128) would share nothing below 129 prompt tokens; its attention takes
    # multiples of 32 only, so 32 is the finest block it can run with
    assert _launch_block_size(VllmEngineKwargs(), cpu_build=True) == 32


def test_a_gpu_build_keeps_vllms_default_unless_set() -> None:
    assert _launch_block_size(VllmEngineKwargs(), cpu_build=False) is None  # vLLM's own 16 on GPUs
    assert _launch_block_size(VllmEngineKwargs(block_size=8), cpu_build=False) == 8
    assert _launch_block_size(VllmEngineKwargs(block_size=64), cpu_build=True) == 64


def test_a_block_size_the_cpu_build_cannot_run_is_refused_before_launch() -> None:
    with pytest.raises(ValueError, match=r"block_size: 16 on vLLM's CPU build.*multiples of 32"):
        kv_block_size(VllmEngineKwargs(block_size=16), cpu_build=True)
    with pytest.raises(ValueError, match="--block-size"):
        check_vllm_config(make_config(), VllmEngineKwargs(extra_args=["--block-size=64"]))
