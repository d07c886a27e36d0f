"""Resolving an eval name to something that yields samples, renders prompts and scores completions.

A dedicated eval (kind ``eval``, e.g. math500) wins; otherwise any registered environment is
used as an eval with its own reward, prompts (``format_prompt`` / multi-turn) and metrics.
Either way the result is an ``Environment``, so evals run through the training rollout code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from telescope.core.env.base import Environment
from telescope.core.env.resolve import create_eval
from telescope.core.env.types import Sample
from telescope.core.registry import Registry, UnknownComponentError, did_you_mean

__all__ = ["LoadedEval", "eval_indices", "load_eval", "resolve_eval"]


def resolve_eval(name: str, kwargs: dict[str, Any] | None, registry: Registry) -> Environment:
    """The registered eval ``name``, else the environment ``name`` used as an eval."""
    if not (registry.has("eval", name) or registry.has("environment", name)):
        valid = sorted({*registry.names("eval"), *registry.names("environment")})
        raise UnknownComponentError(
            f"unknown eval '{name}'.{did_you_mean(name, valid)} An eval is a registered eval or any "
            f"registered environment: {', '.join(valid) or '(none installed)'}."
        )
    return create_eval(registry, name, kwargs)


def eval_indices(num_samples: int, dataset_size: int) -> range:
    """Dataset indices an eval uses: the first ``num_samples`` (-1 = all)."""
    return range(dataset_size if num_samples < 0 else min(num_samples, dataset_size))


@dataclass
class LoadedEval:
    """One ``evals`` entry, resolved and with its samples loaded."""

    entry: Any
    """The ``EvalEntry``."""
    env: Environment
    """The eval (or environment) that renders and scores."""
    samples: list[Sample]
    """The samples evaluated (the first ``num_samples`` of the dataset)."""

    @property
    def name(self) -> str:
        return str(self.entry.name)


def load_eval(entry: Any, registry: Registry) -> LoadedEval:
    """Resolve ``entry`` and load its first ``num_samples`` samples."""
    env = resolve_eval(entry.name, dict(entry.kwargs), registry)
    data = env.samples()
    samples = [data[i] for i in eval_indices(entry.num_samples, len(data))]
    if not samples:
        raise ValueError(f"eval '{entry.name}': its dataset is empty; check its kwargs (data_files, ...)")
    return LoadedEval(entry, env, samples)
