"""System metrics parsing from /proc text and the sampler thread."""

from __future__ import annotations

import threading

import pytest

from telescope.core.observe.samplers.system import (
    CpuSampler,
    SystemMetricsSampler,
    read_proc_meminfo,
    read_proc_stat,
)

STAT = """cpu  100 0 100 700 100 0 0 0 0 0
cpu0 50 0 50 350 50 0 0 0 0 0
intr 1 2 3
"""


def test_read_proc_stat() -> None:
    stats = read_proc_stat(STAT)
    # busy = user+nice+system+irq+softirq+steal = 200; total = 1000 (idle 700 + iowait 100)
    assert stats["cpu"] == (200, 1000) and stats["cpu0"] == (100, 500) and "intr" not in stats


def test_read_proc_meminfo() -> None:
    m = read_proc_meminfo("MemTotal: 4194304 kB\nMemFree: 1 kB\nMemAvailable: 1048576 kB\n")
    assert m == pytest.approx(
        {"system_memory_used_gb": 3.0, "system_memory_available_gb": 1.0, "system_memory_percent": 75.0}
    )


def test_proc_fallback_sampler_on_this_machine() -> None:
    sampler = CpuSampler()
    sampler._psutil = None  # force the /proc path even where psutil is installed
    sampler.sample()
    m = sampler.sample()
    assert 0 <= m["cpu_utilization_percent"] <= 100 and "cpu_core_0_utilization_percent" in m
    assert m["system_memory_available_gb"] > 0


def test_sampler_thread_calls_back_and_stops() -> None:
    got: list[dict] = []
    enough = threading.Event()

    def callback(sample: dict) -> None:
        got.append(sample)
        if len(got) >= 3:
            enough.set()

    sampler = SystemMetricsSampler(callback, interval_s=0.01, gpus=True)
    sampler.start()
    assert enough.wait(10)
    sampler.stop()
    count = len(got)
    assert {"time", "node", "metrics"} <= set(got[0]) and "cpu_utilization_percent" in got[0]["metrics"]
    assert not any(k.startswith("gpu/") for k in got[0]["metrics"]) or sampler._gpu.available
    enough.wait(0.05)
    assert len(got) == count  # stopped
    with pytest.raises(ValueError, match="must be > 0"):
        SystemMetricsSampler(callback, interval_s=0)
