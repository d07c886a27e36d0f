"""RL algorithms: advantages and policy losses, selected by name through the plugin registry.

Importing this package does not import torch; the algorithm modules (which do) load when
an algorithm is resolved or when one of the re-exported names below is first touched.

Entry points (``cfg`` is the run's ``TelescopeConfig``):

- ``compute_advantages(rewards, cfg)``: stage-1 advantages of ``[num_groups, group_size]`` rewards;
- ``normalize_batch_advantages(advantages, cfg)``: stage 2 over one training batch
  (identity unless the effective ``advantage_norm`` is ``"batch"``);
- ``policy_loss(inputs, cfg)``: one micro-batch's ``LossOutputs``;
- ``get_algorithm(name, registry=None)``: the ``Algorithm`` a plugin registered under ``name``.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from telescope.core.algorithms.base import Algorithm, LossInputs, LossOutputs
    from telescope.core.config import TelescopeConfig
    from telescope.core.registry import Registry

__all__ = [
    "Algorithm",
    "LossInputs",
    "LossOutputs",
    "StepMetrics",
    "compute_advantages",
    "get_algorithm",
    "kl_divergence_inference",
    "normalize_batch_advantages",
    "policy_loss",
    "token_entropy",
    "token_logprobs",
]

_LAZY = {
    "Algorithm": "telescope.core.algorithms.base",
    "LossInputs": "telescope.core.algorithms.inputs",
    "LossOutputs": "telescope.core.algorithms.base",
    "StepMetrics": "telescope.core.algorithms.metrics",
    "kl_divergence_inference": "telescope.core.algorithms.metrics",
    "token_entropy": "telescope.core.algorithms.logprobs",
    "token_logprobs": "telescope.core.algorithms.logprobs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


@functools.lru_cache(maxsize=1)
def _installed_registry() -> Registry:
    """Registry of every installed plugin, built once per process on first use."""
    from telescope.core.plugins import load_plugins

    return load_plugins()[1]


def get_algorithm(name: str, registry: Registry | None = None) -> Algorithm:
    """Build the algorithm registered as ``name`` (``registry`` defaults to the installed plugins).

    Raises:
        telescope.core.registry.UnknownComponentError: no plugin registers ``name``; the
            message lists the registered algorithms.
        TypeError: the factory did not return an ``Algorithm``.
    """
    from telescope.core.algorithms.base import Algorithm

    reg = registry if registry is not None else _installed_registry()
    algorithm = reg.create("algorithm", name)
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm '{name}' factory returned {type(algorithm).__name__}, not a "
            "telescope.core.algorithms.Algorithm subclass instance"
        )
    return algorithm


def compute_advantages(rewards: Any, cfg: TelescopeConfig, registry: Registry | None = None) -> torch.Tensor:
    """Stage-1 advantages of ``rewards`` [num_groups, group_size] for ``cfg.algorithm``."""
    return get_algorithm(cfg.algorithm, registry).compute_advantages(rewards, cfg)


def normalize_batch_advantages(
    advantages: Any, cfg: TelescopeConfig, registry: Registry | None = None
) -> torch.Tensor:
    """Stage-2 (batch) normalisation of one training batch's advantages for ``cfg.algorithm``."""
    return get_algorithm(cfg.algorithm, registry).normalize_batch_advantages(advantages, cfg)


def policy_loss(inputs: LossInputs, cfg: TelescopeConfig, registry: Registry | None = None) -> LossOutputs:
    """``cfg.algorithm``'s loss share and metrics for one packed micro-batch."""
    return get_algorithm(cfg.algorithm, registry).policy_loss(inputs, cfg)
