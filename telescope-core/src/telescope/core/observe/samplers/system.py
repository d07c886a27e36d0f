"""System metrics: CPU and memory always (psutil, else /proc), GPUs through NVML when present.

Metric names follow the seed/reference: ``cpu_utilization_percent``,
``cpu_core_{i}_utilization_percent``, ``system_memory_used_gb``,
``system_memory_available_gb``, ``system_memory_percent``, and per GPU ``gpu/{i}/<name>``
with ``gpu_utilization_percent``, ``gpu_memory_used_gb``, ``gpu_memory_free_gb``,
``gpu_memory_used_percent``, ``gpu_temperature_c``, ``gpu_power_w``, ``gpu_clock_sm_mhz``,
``gpu_clock_mem_mhz``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from telescope.core.observe.periodic import PeriodicThread

__all__ = ["CpuSampler", "GpuSampler", "SystemMetricsSampler", "read_proc_meminfo", "read_proc_stat"]

_log = logging.getLogger("telescope.observe")
_GB = 1024**3


def read_proc_stat(text: str) -> dict[str, tuple[int, int]]:
    """``{"cpu": (busy, total), "cpu0": ...}`` jiffies from the text of /proc/stat."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # user..steal; guest time is already inside user
        out[name] = (total - idle, total)
    return out


def read_proc_meminfo(text: str) -> dict[str, float]:
    """Memory metrics (GB, percent) from the text of /proc/meminfo."""
    kb = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            kb[key] = int(parts[0])
    total = kb["MemTotal"] * 1024
    available = kb.get("MemAvailable", kb.get("MemFree", 0)) * 1024
    return {
        "system_memory_used_gb": (total - available) / _GB,
        "system_memory_available_gb": available / _GB,
        "system_memory_percent": 100.0 * (total - available) / total,
    }


class CpuSampler:
    """CPU utilisation since the previous call, and memory, from psutil or /proc."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:
            psutil = None
        self._psutil: Any = psutil
        self._prev: dict[str, tuple[int, int]] | None = None
        self.sample()  # prime the utilisation deltas

    def sample(self) -> dict[str, float]:
        if self._psutil is not None:
            return self._sample_psutil()
        return self._sample_proc()

    def _sample_psutil(self) -> dict[str, float]:
        ps = self._psutil
        out = {"cpu_utilization_percent": float(ps.cpu_percent(interval=None))}
        for i, pct in enumerate(ps.cpu_percent(interval=None, percpu=True)):
            out[f"cpu_core_{i}_utilization_percent"] = float(pct)
        mem = ps.virtual_memory()
        out["system_memory_used_gb"] = (mem.total - mem.available) / _GB
        out["system_memory_available_gb"] = mem.available / _GB
        out["system_memory_percent"] = float(mem.percent)
        return out

    def _sample_proc(self) -> dict[str, float]:
        with open("/proc/stat") as f:
            now = read_proc_stat(f.read())
        out: dict[str, float] = {}
        prev, self._prev = self._prev, now
        if prev is not None:
            for name, (busy, total) in now.items():
                pbusy, ptotal = prev.get(name, (busy, total))
                pct = 100.0 * (busy - pbusy) / (total - ptotal) if total > ptotal else 0.0
                key = (
                    "cpu_utilization_percent" if name == "cpu" else f"cpu_core_{name[3:]}_utilization_percent"
                )
                out[key] = pct
        with open("/proc/meminfo") as f:
            out.update(read_proc_meminfo(f.read()))
        return out


class GpuSampler:
    """Per-GPU NVML readings; ``available`` is False without pynvml or a driver."""

    def __init__(self) -> None:
        self.available = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.available = True
        except Exception as exc:  # noqa: BLE001 - no NVML is normal on CPU machines
            _log.debug("NVML unavailable, no GPU metrics: %s", exc)

    def sample(self) -> dict[str, float]:
        if not self.available:
            return {}
        out: dict[str, float] = {}
        for i, h in enumerate(self._handles):
            for name, value in self._one(h).items():
                out[f"gpu/{i}/{name}"] = value
        return out

    def _one(self, h: Any) -> dict[str, float]:
        nv = self._nvml
        out: dict[str, float] = {}
        readers: dict[str, Callable[[], float]] = {
            "gpu_utilization_percent": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu_memory_bandwidth_utilization_percent": lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
            "gpu_temperature_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "gpu_power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "gpu_clock_sm_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "gpu_clock_mem_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        }
        for name, read in readers.items():
            with contextlib.suppress(Exception):  # a metric a GPU does not expose is left out
                out[name] = float(read())
        with contextlib.suppress(Exception):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out["gpu_memory_used_gb"] = mem.used / _GB
            out["gpu_memory_free_gb"] = mem.free / _GB
            out["gpu_memory_used_percent"] = 100.0 * mem.used / mem.total
        return out


class SystemMetricsSampler:
    """Background thread calling ``callback(sample)`` every ``interval_s`` seconds.

    ``sample = {"time": unix seconds, "node": hostname, "source": "system", "metrics": {name: value}}``.
    A failed sample is logged (once per distinct error) and sampling goes on.
    """

    def __init__(
        self, callback: Callable[[dict[str, Any]], None], interval_s: float = 1.0, gpus: bool = True
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"system metrics interval {interval_s} must be > 0 seconds")
        self._callback = callback
        self._cpu = CpuSampler()
        self._gpu = GpuSampler() if gpus else None
        self._thread = PeriodicThread(self._sample_once, interval_s, "telescope-system-metrics")

    @property
    def samples_taken(self) -> int:
        """Samples handed to the callback so far."""
        return self._thread.calls

    def sample(self) -> dict[str, Any]:
        metrics = self._cpu.sample()
        if self._gpu is not None:
            metrics.update(self._gpu.sample())
        return {"time": time.time(), "node": socket.gethostname(), "source": "system", "metrics": metrics}

    def _sample_once(self) -> None:
        self._callback(self.sample())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
