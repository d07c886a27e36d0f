"""``separate_eval_samples``: the samples an eval uses never reach training.

For an eval entry with ``separate_eval_samples`` whose name is a training environment, the
training indices whose sample equals one of the eval's samples (prompt and answer) are
excluded. Comparing content, not indices, keeps this right when the eval's kwargs differ
from the training entry's (another order, a shuffle, another split).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from telescope.core.env.resolve import create_environment
from telescope.core.env.types import Sample
from telescope.core.evals.resolve import load_eval

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["sample_key", "training_exclusions"]


def sample_key(sample: Sample) -> str:
    """What makes two samples the same task: prompt and reference answer."""
    return json.dumps([sample.prompt, sample.answer], sort_keys=True, default=str)


def training_exclusions(cfg: TelescopeConfig, registry: Any) -> dict[str, frozenset[int]]:
    """``{training environment name: indices reserved for evals}`` (empty when nothing is reserved)."""
    training = {e.name: e for e in cfg.environments}
    reserved: dict[str, set[str]] = {}
    for entry in cfg.evals:
        if not entry.separate_eval_samples or entry.name not in training:
            continue
        if entry.num_samples < 0:
            raise ValueError(
                f"evals: '{entry.name}' has separate_eval_samples with num_samples -1, which reserves the whole "
                "dataset and leaves nothing to train on; set num_samples to the size of the held-out set"
            )
        reserved.setdefault(entry.name, set()).update(
            sample_key(s) for s in load_eval(entry, registry).samples
        )
    out: dict[str, frozenset[int]] = {}
    for name, keys in reserved.items():
        env_entry = training[name]
        env = create_environment(registry, name, dict(env_entry.kwargs))
        out[name] = frozenset(i for i, s in enumerate(env.samples()) if sample_key(s) in keys)
    return out
