"""The training runtime: Ray placement, inference servers, trainer ranks and the orchestrator.

``run_training(cfg, pset, registry)`` is what ``telescope train`` calls.
"""

from __future__ import annotations

from telescope.core.runtime.driver import run_training

__all__ = ["run_training"]
