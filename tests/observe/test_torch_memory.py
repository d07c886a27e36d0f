"""Torch memory: sampled in a worker at torch_memory_sample_interval_seconds, drained to the driver
at ray_torch_memory_drain_interval_seconds, logged as ``source: "torch"`` samples."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from telescope.core.observe import Logger, LoggerHub, RunDirReader
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.samplers.torch_memory import (
    RayDrainFetcher,
    TorchMemoryDrainer,
    TorchMemorySampler,
    read_torch_memory,
)
from telescope.core.testing import make_config

_GB = 1024**3


def test_no_reading_when_torch_is_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert read_torch_memory() is None
    sampler = TorchMemorySampler(0.1)
    assert sampler.sample_once() is False and sampler.drain() == []
    assert "torch" not in sys.modules  # the sampler never imports it


def test_cpu_reading_tracks_a_tensor_allocation() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised here: the CUDA counters are read instead")
    before = read_torch_memory()
    assert before is not None and before["process_rss_gb"] > 0
    assert before["process_peak_rss_gb"] >= before["process_rss_gb"]
    tensor = torch.ones(16 * 1024 * 1024, dtype=torch.float32)  # 64 MiB, touched
    after = read_torch_memory()
    assert after is not None
    expected = tensor.numel() * 4 / _GB  # 0.0625 GiB
    assert after["malloc_in_use_gb"] - before["malloc_in_use_gb"] == pytest.approx(expected, rel=0.1)
    assert after["process_rss_gb"] - before["process_rss_gb"] >= 0.9 * expected
    del tensor


def test_sampler_buffers_with_time_rank_and_a_bound(clock) -> None:
    readings = iter([{"process_rss_gb": float(i)} for i in range(5)])
    sampler = TorchMemorySampler(0.1, rank=3, reader=lambda: next(readings), clock=clock, max_samples=3)
    for _ in range(5):
        clock.advance(0.1)
        assert sampler.sample_once()
    drained = sampler.drain()
    assert [s["metrics"]["process_rss_gb"] for s in drained] == [2.0, 3.0, 4.0]  # oldest two dropped
    assert sampler.dropped == 2
    assert drained[0]["time"] == pytest.approx(1000.3) and drained[0]["rank"] == 3
    assert drained[0]["source"] == "torch" and drained[0]["node"]
    assert sampler.drain() == []


def test_sampler_thread_samples_at_its_interval() -> None:
    sampler = TorchMemorySampler.from_config(make_config(torch_memory_sample_interval_seconds=0.01), rank=0)
    assert sampler.interval_s == 0.01
    sampler._reader = lambda: {"x": 1.0}  # a reading that does not need torch
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler._buffer) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    samples = sampler.drain()
    assert len(samples) >= 5
    assert all(b["time"] >= a["time"] for a, b in zip(samples, samples[1:], strict=False))


def test_drainer_logs_every_sample_and_drains_once_more_on_stop() -> None:
    batches = [[{"metrics": {"i": 0.0}}, {"metrics": {"i": 1.0}}], [], [{"metrics": {"i": 2.0}}]]
    logged: list[dict[str, Any]] = []
    drainer = TorchMemoryDrainer(lambda: batches.pop(0) if batches else [], logged.append, interval_s=60)
    assert drainer.drain_once() == 2 and drainer.drain_once() == 0
    drainer.start()
    drainer.stop()  # the 60 s interval never elapsed: stop drains the last batch itself
    assert [s["metrics"]["i"] for s in logged] == [0.0, 1.0, 2.0] and drainer.samples == 3


class _Ref:
    def __init__(self, value: list[dict[str, Any]]) -> None:
        self.value, self.ready = value, False


class _FakeRay:
    initialized = True

    @classmethod
    def is_initialized(cls) -> bool:
        return cls.initialized

    @staticmethod
    def wait(refs: list[_Ref], num_returns: int, timeout: float) -> tuple[list[_Ref], list[_Ref]]:
        assert timeout == 0  # never blocks the drain thread
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    @staticmethod
    def get(ref: _Ref) -> list[dict[str, Any]]:
        assert ref.ready
        return ref.value


class _Actor:
    """Stands in for a Ray actor handle: ``drain_torch_memory.remote()`` returns a ref."""

    def __init__(self, rank: int) -> None:
        self.rank, self.refs = rank, []
        self.drain_torch_memory = self

    def remote(self) -> _Ref:
        self.refs.append(_Ref([{"rank": self.rank, "n": len(self.refs)}]))
        return self.refs[-1]


def test_ray_fetcher_keeps_one_call_in_flight_per_worker() -> None:
    fast, busy = _Actor(0), _Actor(1)
    fetch = RayDrainFetcher([fast, busy], ray_module=_FakeRay)
    assert fetch() == []  # both calls submitted, none finished
    fast.refs[0].ready = True
    assert fetch() == [{"rank": 0, "n": 0}]
    assert fetch() == []  # fast is asked again; busy (in a train step) still has its call in flight
    assert len(fast.refs) == 2 and len(busy.refs) == 1
    busy.refs[0].ready = fast.refs[1].ready = True
    assert sorted(s["rank"] for s in fetch()) == [0, 1]


def test_ray_fetcher_calls_no_actor_once_ray_is_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # A call after ray.shutdown() (a run restarting) would start a new local Ray from the drain thread.
    actor = _Actor(0)
    fetch = RayDrainFetcher([actor], ray_module=_FakeRay)
    monkeypatch.setattr(_FakeRay, "initialized", False)
    assert fetch() == [] and actor.refs == []


class _SystemRecorder(Logger):
    name = "system-recorder"

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []

    def log_system(self, sample: dict[str, Any]) -> None:
        self.samples.append(sample)


def test_hub_torch_memory_source_reaches_every_logger(tmp_path: Path) -> None:
    sampler = TorchMemorySampler(0.01, rank=0, reader=lambda: {"process_rss_gb": 1.5})
    for _ in range(3):
        sampler.sample_once()
    rec = _SystemRecorder()
    cfg = make_config(use_wandb=False, ray_torch_memory_drain_interval_seconds=30)
    hub = LoggerHub([LocalLogger(), rec])
    hub.start(cfg, tmp_path, system_metrics=False, ticker=False)
    calls = []
    hub.add_torch_memory_source(lambda: calls.append(1) or sampler.drain())
    hub.stop_sources()  # before the workers stop: the 30 s interval never came, one final drain
    assert len(calls) == 1
    hub.finish("finished")
    assert len(calls) == 1  # finish does not drain stopped sources again
    assert [s["metrics"] for s in rec.samples] == [{"process_rss_gb": 1.5}] * 3
    torch_rows = [s for s in RunDirReader(tmp_path).system() if s["source"] == "torch"]
    assert len(torch_rows) == 3 and {s["rank"] for s in torch_rows} == {0}


@pytest.mark.gpu
def test_cuda_reading_tracks_a_cuda_allocation() -> None:
    import torch

    torch.cuda.init()
    before = read_torch_memory()
    tensor = torch.ones(64 * 1024 * 1024, dtype=torch.float32, device="cuda")  # 256 MiB
    after = read_torch_memory()
    assert before is not None and after is not None and "malloc_in_use_gb" not in after
    grown = after["torch_cuda_memory_allocated_gb"] - before["torch_cuda_memory_allocated_gb"]
    assert grown == pytest.approx(tensor.numel() * 4 / _GB, rel=0.01)
    assert after["torch_cuda_memory_reserved_gb"] >= after["torch_cuda_memory_allocated_gb"]
    assert after["torch_cuda_max_memory_allocated_gb"] >= after["torch_cuda_memory_allocated_gb"]


class _SamplingActor:
    """What a trainer worker adds: a sampler started in __init__ and a drain method."""

    def __init__(self, rank: int) -> None:
        import torch  # noqa: F401 - the sampler reads only once torch is imported

        self.sampler = TorchMemorySampler(0.02, rank=rank).start()

    def drain_torch_memory(self) -> list[dict[str, Any]]:
        return self.sampler.drain()

    def busy(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.mark.slow
def test_real_ray_workers_drained_into_the_run_directory(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor_cls = ray.remote(num_cpus=0.1)(_SamplingActor)
        actors = [actor_cls.remote(rank) for rank in range(2)]
        # Both actors constructed (torch imported, sampler running) before the 1.5 s window opens:
        # on a loaded machine rank 0's start-up alone could take the whole window.
        ray.get([actor.busy.remote(0.0) for actor in actors])
        busy = actors[1].busy.remote(1.0)  # rank 1 is "in a train step" for 1 s
        cfg = make_config(use_wandb=False, ray_torch_memory_drain_interval_seconds=0.1)
        hub = LoggerHub([LocalLogger()])
        hub.start(cfg, tmp_path, system_metrics=False)
        hub.add_torch_memory_source(RayDrainFetcher(actors))
        ray.get(busy)
        time.sleep(0.5)
        hub.finish("finished")
    finally:
        ray.shutdown()
    rows = [s for s in RunDirReader(tmp_path).system() if s["source"] == "torch"]
    assert {s["rank"] for s in rows} == {0, 1}
    assert all(s["metrics"]["process_rss_gb"] > 0 and "malloc_in_use_gb" in s["metrics"] for s in rows)
    by_rank = [sorted(s["time"] for s in rows if s["rank"] == r) for r in (0, 1)]
    assert all(len(times) >= 10 for times in by_rank)  # 1.5 s at 0.02 s, generously bounded
