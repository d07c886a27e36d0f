"""Torch-side helpers shared by the algorithm tests: configs and ``LossInputs`` from NumPy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from algorithms_reference import Case
from pydantic import ValidationError

from telescope.core.algorithms.base import LossInputs
from telescope.core.config import TelescopeConfig
from telescope.core.testing import make_config


def config_for(case: Case, **extra: Any) -> TelescopeConfig:
    """A ``TelescopeConfig`` carrying the case's loss fields.

    Combinations the config model rejects (TIS + PPO clip against rollout logprobs) are set
    on a valid config without validation (``model_copy(update=...)``), as a config that got
    past the checks would arrive, so the loss's own refusal can be tested.
    """
    fields = {k: getattr(case, k) for k in Case.__dataclass_fields__}
    fields.update(extra)
    try:
        return make_config(**fields)
    except ValidationError:
        return make_config().model_copy(update=fields)


def loss_inputs(
    batch: dict, *, lp: torch.Tensor | None = None, num_loss_tokens=None, num_samples=None
) -> LossInputs:
    """``LossInputs`` (float64) from a ``packed_batch`` dict; ``lp`` overrides the logprobs."""
    t = {k: torch.as_tensor(batch[k]) for k in ("lp", "mu", "old", "adv", "mask", "pos")}
    return LossInputs(
        logprobs=t["lp"].clone().requires_grad_(True) if lp is None else lp,
        inference_logprobs=t["mu"],
        old_logprobs=t["old"],
        advantages=t["adv"],
        loss_mask=t["mask"],
        position_ids=t["pos"],
        num_loss_tokens=float(np.sum(batch["mask"])) if num_loss_tokens is None else num_loss_tokens,
        num_samples=batch["num_samples"] if num_samples is None else num_samples,
    )
