"""Telescope core: plugin hooks, the component registry, configuration and base interfaces.

Importing this package is cheap: it never imports torch, ray, transformers or vllm.
"""

from __future__ import annotations

from importlib import metadata as _metadata

import pluggy as _pluggy

__all__ = ["__version__", "hookimpl"]

#: Decorator for plugin hook implementations: ``@hookimpl def telescope_register_...``.
hookimpl = _pluggy.HookimplMarker("telescope")

try:
    __version__ = _metadata.version("telescope-core")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"
