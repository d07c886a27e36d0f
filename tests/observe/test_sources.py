"""The hub's metric sources follow the config: system interval, track_gpu_events (NVML), vLLM, OTLP."""

from __future__ import annotations

import json
import socket
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from telescope.core.cluster.run_secret import ENV_VAR, auth_headers
from telescope.core.observe import LoggerHub, RunDirReader
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.samplers import system as system_module
from telescope.core.observe.samplers.system import GpuSampler
from telescope.core.testing import make_config

GB = 1024**3


class _NvmlError(Exception):
    pass


def _fake_pynvml(power_fails_on: int | None = None) -> types.ModuleType:
    """Two GPUs with fixed readings; GPU ``power_fails_on`` cannot report power (as some cannot)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 0, 1, 2  # type: ignore[attr-defined]

    def power(h: int) -> int:
        if h == power_fails_on:
            raise _NvmlError("Not Supported")
        return 250_500 + h * 1000  # milliwatts

    nv.__dict__.update(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + h, memory=20),
        nvmlDeviceGetTemperature=lambda h, kind: 60 + h,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 1 else 2619,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=20 * GB, free=60 * GB, total=80 * GB),
    )
    return nv


def test_gpu_sampler_reads_every_documented_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(power_fails_on=1))
    sampler = GpuSampler()
    assert sampler.available
    got = sampler.sample()
    gpu0 = {
        "gpu_utilization_percent": 50.0,
        "gpu_memory_bandwidth_utilization_percent": 20.0,
        "gpu_temperature_c": 60.0,
        "gpu_power_w": 250.5,
        "gpu_clock_sm_mhz": 1980.0,
        "gpu_clock_mem_mhz": 2619.0,
        "gpu_memory_used_gb": 20.0,
        "gpu_memory_free_gb": 60.0,
        "gpu_memory_used_percent": 25.0,
    }
    gpu1 = {**gpu0, "gpu_utilization_percent": 51.0, "gpu_temperature_c": 61.0}
    del gpu1["gpu_power_w"]  # a reading the GPU does not expose is left out, the rest stay
    expected = {f"gpu/0/{k}": v for k, v in gpu0.items()} | {f"gpu/1/{k}": v for k, v in gpu1.items()}
    assert got == pytest.approx(expected) and set(got) == set(expected)
    doc = (Path(__file__).parents[2] / "docs" / "run-directory.md").read_text()
    assert all(f"`{name}`" in doc for name in gpu0)  # the names the schema documents


def test_no_nvml_means_no_gpu_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sampler = GpuSampler()
    assert not sampler.available and sampler.sample() == {}


@pytest.mark.parametrize("track", [True, False])
def test_track_gpu_events_switches_gpu_metrics_in_system_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, track: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    cfg = make_config(
        use_wandb=False,
        track_gpu_events=track,
        system_metrics_collection_interval_seconds=0.02,
        metrics_logger_interval_seconds=0.05,
    )
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path)
    deadline = time.monotonic() + 10
    while not RunDirReader(tmp_path).system() and time.monotonic() < deadline:
        time.sleep(0.02)
    hub.finish("finished")
    samples = RunDirReader(tmp_path).system()
    assert samples and all("cpu_utilization_percent" in s["metrics"] for s in samples)
    has_gpu = [any(k.startswith("gpu/") for k in s["metrics"]) for s in samples]
    assert all(has_gpu) if track else not any(has_gpu)
    if track:
        assert samples[0]["metrics"]["gpu/1/gpu_power_w"] == pytest.approx(251.5)


def test_hub_passes_the_system_interval_and_gpu_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, callback: Any, interval_s: float, gpus: bool) -> None:
            made.append({"interval_s": interval_s, "gpus": gpus})

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(system_module, "SystemMetricsSampler", Recorder)
    cfg = make_config(use_wandb=False, system_metrics_collection_interval_seconds=7.5, track_gpu_events=False)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, ticker=False)
    hub.finish("finished")
    assert made == [{"interval_s": 7.5, "gpus": False}]


def test_vllm_scrape_interval_defaults_to_the_system_interval(tmp_path: Path) -> None:
    cfg = make_config(use_wandb=False, system_metrics_collection_interval_seconds=30.0)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, system_metrics=False, ticker=False)
    hub.add_prometheus_scraper({0: "http://127.0.0.1:9"})
    hub.add_prometheus_scraper({1: "http://127.0.0.1:9"}, interval_s=0.5)
    intervals = [s.interval_s for s in hub._scrapers]
    hub.finish("finished")
    assert intervals == [30.0, 0.5]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post_json(port: int, doc: dict[str, Any]) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", **auth_headers()},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(resp.status)


def test_otlp_receiver_follows_enable_vllm_tracing_and_stops_with_the_hub(
    tmp_path: Path, otlp_json: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "hub-secret")
    off = LoggerHub([LocalLogger()])
    off.start(
        make_config(use_wandb=False, enable_vllm_tracing=False),
        tmp_path / "off",
        system_metrics=False,
        ticker=False,
    )
    assert off.add_otlp_receiver() is None
    off.finish("finished")

    port = _free_port()
    cfg = make_config(use_wandb=False, enable_vllm_tracing=True, otlp_receiver_port=port)
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path / "on", system_metrics=False, ticker=False)
    receiver = hub.add_otlp_receiver()
    assert receiver.port == port
    receiver.expect("9")
    doc = otlp_json(
        ("gen_ai.request.id", "stringValue", "cmpl-9-0"),
        ("gen_ai.latency.time_to_first_token", "doubleValue", 0.125),
    )
    assert _post_json(port, doc) == 200
    assert receiver.timings("cmpl-9") == {"ttft": 0.125}
    hub.finish("finished")
    with pytest.raises(urllib.error.URLError):
        _post_json(port, doc)  # the port is closed with the hub's other sources
