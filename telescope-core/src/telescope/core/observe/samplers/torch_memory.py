"""Torch memory samples in trainer processes, drained to the driver (seed: ``torch_memory_*``).

In each trainer worker a ``TorchMemorySampler`` thread takes a sample every
``torch_memory_sample_interval_seconds`` into a bounded buffer; the driver drains every
worker every ``ray_torch_memory_drain_interval_seconds`` (``TorchMemoryDrainer`` with a
``RayDrainFetcher``) and logs the samples as ``source: "torch"`` records in system.jsonl.

The sampler never imports torch: it samples only once torch is imported in its process.
With CUDA initialised it reads ``torch.cuda`` allocator counters; otherwise (CPU training)
torch has no CPU allocator counters, so it reports the process RSS and glibc's malloc
in-use bytes, the allocator torch's CPU tensors come from.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from telescope.core.observe.periodic import PeriodicThread

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig


__all__ = ["RayDrainFetcher", "TorchMemoryDrainer", "TorchMemorySampler", "read_torch_memory"]

_GB = 1024**3


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_in_use_bytes() -> int | None:
    """glibc ``mallinfo2``: bytes in use from the heap (uordblks) plus mmapped blocks (hblkhd)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
        fn.restype = _MallInfo2
        info = fn()
        return int(info.uordblks + info.hblkhd)
    return None


def _process_memory() -> dict[str, float]:
    """Resident set size now and at its peak, from /proc/self/status (Linux)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                name = "process_rss_gb" if key == "VmRSS" else "process_peak_rss_gb"
                out[name] = int(rest.split()[0]) * 1024 / _GB
    return out


def read_torch_memory() -> dict[str, float] | None:
    """One reading, or None when torch is not imported in this process (it is never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    out = _process_memory()
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        dev = cuda.current_device()
        out["torch_cuda_memory_allocated_gb"] = cuda.memory_allocated(dev) / _GB
        out["torch_cuda_memory_reserved_gb"] = cuda.memory_reserved(dev) / _GB
        out["torch_cuda_max_memory_allocated_gb"] = cuda.max_memory_allocated(dev) / _GB
        out["torch_cuda_device"] = float(dev)
    else:
        in_use = _malloc_in_use_bytes()
        if in_use is not None:
            out["malloc_in_use_gb"] = in_use / _GB
    return out


class TorchMemorySampler:
    """Samples ``reader()`` every ``interval_s`` into a buffer of at most ``max_samples``.

    ``drain()`` returns and clears the buffer; samples pushed out of a full buffer are
    counted in ``dropped`` (the driver drains far more often than it fills).
    """

    def __init__(
        self,
        interval_s: float,
        *,
        rank: int | None = None,
        reader: Callable[[], dict[str, float] | None] = read_torch_memory,
        clock: Callable[[], float] = time.time,
        max_samples: int = 10_000,
    ) -> None:
        self.interval_s = float(interval_s)
        self.rank = rank
        self._reader = reader
        self._clock = clock
        self._node = socket.gethostname()
        self._buffer: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._thread = PeriodicThread(self.sample_once, self.interval_s, "telescope-torch-memory")
        self.dropped = 0

    @classmethod
    def from_config(cls, cfg: TelescopeConfig, *, rank: int | None = None) -> TorchMemorySampler:
        """A sampler at ``cfg.torch_memory_sample_interval_seconds``."""
        return cls(float(cfg.torch_memory_sample_interval_seconds), rank=rank)

    def sample_once(self) -> bool:
        """Take one sample now; False when there is nothing to read (torch not imported)."""
        metrics = self._reader()
        if not metrics:
            return False
        sample = {
            "time": self._clock(),
            "node": self._node,
            "source": "torch",
            "rank": self.rank,
            "metrics": metrics,
        }
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._buffer.append(sample)
        return True

    def drain(self) -> list[dict[str, Any]]:
        """The samples taken since the last drain, oldest first."""
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def start(self) -> TorchMemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()


class TorchMemoryDrainer(PeriodicThread):
    """Driver side: every ``interval_s``, pass each sample ``fetch()`` returns to ``log``.

    ``stop`` drains one last time, so samples taken just before the end are kept.
    """

    def __init__(
        self,
        fetch: Callable[[], list[dict[str, Any]]],
        log: Callable[[dict[str, Any]], Any],
        interval_s: float,
    ) -> None:
        super().__init__(self.drain_once, interval_s, "telescope-torch-memory-drain")
        self._fetch = fetch
        self._log = log
        self._drain_lock = threading.Lock()
        self.samples = 0

    def drain_once(self) -> int:
        with self._drain_lock:
            samples = self._fetch()
            for sample in samples:
                self._log(sample)
            self.samples += len(samples)
            return len(samples)

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        with contextlib.suppress(Exception):  # a worker already gone has nothing left to give
            self.drain_once()


class RayDrainFetcher:
    """``fetch()`` for ``TorchMemoryDrainer`` over Ray actors exposing ``drain_torch_memory()``.

    Never blocks: one call per actor is in flight at a time, and only finished calls are
    collected (a worker busy in a synchronous ``train_step`` answers after the step; its
    samples keep their own timestamps).
    """

    def __init__(self, actors: list[Any], method: str = "drain_torch_memory", ray_module: Any = None) -> None:
        if ray_module is None:
            import ray as ray_module
        self._ray = ray_module
        self._actors = list(actors)
        self._method = method
        self._pending: dict[int, Any] = {}

    def __call__(self) -> list[dict[str, Any]]:
        if not self._ray.is_initialized():
            # Ray is shut down (a run restarting or ending): a call now would start a new local
            # Ray from this thread, and the restart's own ray.init would then fail.
            return []
        for i, actor in enumerate(self._actors):
            if i not in self._pending:
                self._pending[i] = getattr(actor, self._method).remote()
        refs = list(self._pending.values())
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        out: list[dict[str, Any]] = []
        for i, ref in list(self._pending.items()):
            if ref in ready_set:
                del self._pending[i]
                out.extend(self._ray.get(ref))
        return out
