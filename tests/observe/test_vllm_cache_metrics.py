"""The KV-cache block size and block count a vLLM server runs with reach the run's vLLM metrics (from its
``cache_config_info`` info metric, whose value is always 1: its labels are what it says)."""

from __future__ import annotations

import io
import urllib.request
from typing import Any

import pytest

from telescope.core.cluster.run_secret import ENV_VAR
from telescope.core.observe.samplers.prometheus import PrometheusScraper, cache_config_metrics, info_labels

# vLLM 0.32's exposition (CacheConfig.metrics_info: every field as a string label), abridged
METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
kv_offloading_backend="native",mamba_block_size="None",num_gpu_blocks="2048",note="a \\"quoted\\", b"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 224.0
"""


def test_the_block_size_and_count_are_read_from_the_labels() -> None:
    labels = info_labels(METRICS, "vllm:cache_config_info")
    assert labels["enable_prefix_caching"] == "True" and labels["note"] == 'a \\"quoted\\", b'
    assert cache_config_metrics(METRICS) == {"kv_cache_block_size": 32.0, "kv_cache_num_blocks": 2048.0}
    # before the KV cache is sized vLLM says num_gpu_blocks="None": left out, not made up
    assert cache_config_metrics(METRICS.replace('"2048"', '"None"')) == {"kv_cache_block_size": 32.0}
    assert cache_config_metrics("vllm:num_requests_running 0.0\n") == {}


def test_a_scrape_carries_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "s" * 40)

    def urlopen(request: Any, timeout: float) -> io.BytesIO:  # a fake server's answer
        return io.BytesIO(METRICS.encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    sample = PrometheusScraper({0: "http://127.0.0.1:1"}, lambda s: None).scrape(0)
    metrics = sample["metrics"]
    assert metrics["kv_cache_block_size"] == 32.0 and metrics["kv_cache_num_blocks"] == 2048.0
    assert metrics["prefix_cache_hit_rate"] == 224.0 / 640.0


def test_the_prefix_cache_size_is_vllms_own_count_of_tokens_else_blocks_times_block_size() -> None:
    """A hybrid model's requests take blocks in several KV groups: blocks x size overstates what one
    holds, and vLLM 0.32 says the group-aware size itself (``kv_cache_size_tokens``)."""
    from telescope.core.observe.samplers.prometheus import kv_cache_tokens

    hybrid = METRICS.replace(
        'kv_offloading_backend="native"', 'kv_cache_size_tokens="20480",kv_offloading_backend="native"'
    )
    assert kv_cache_tokens(cache_config_metrics(hybrid)) == 20_480  # not 2,048 x 32 = 65,536
    assert kv_cache_tokens(cache_config_metrics(METRICS)) == 65_536  # older vLLM: blocks x block size
    assert kv_cache_tokens(cache_config_metrics(METRICS.replace('"2048"', '"None"'))) is None  # not sized yet
    assert kv_cache_tokens({}) is None  # not vLLM
