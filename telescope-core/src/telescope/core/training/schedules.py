"""Learning-rate schedules as a torch-free multiplier of ``learning_rate``.

``lr_factor(step)`` is the factor applied during 0-indexed training step ``step`` (the
scheduler advances once per train step, whatever ``number_of_minibatches`` is):

- ``none``: 1 always (fixed LR).
- ``constant``: linear warmup, then 1.
- ``linear``: warmup, then a linear decay from 1 to ``min_lr_ratio``.
- ``cosine``: warmup, then ``min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi p)) / 2``.

Warmup: for ``step < warmup_steps`` the factor is ``(step + 1) / warmup_steps``, so the first
step already learns (no step at LR 0) and the last warmup step reaches the full LR.
Decay progress ``p = (step - warmup_steps) / max(total_steps - 1 - warmup_steps, 1)``, clamped
to [0, 1]: the first step after warmup uses the full LR and the last step
(``total_steps - 1``) uses exactly ``min_lr_ratio * learning_rate``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["SCHEDULES", "LRSchedule", "lr_factor"]

SCHEDULES = ("none", "constant", "linear", "cosine")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the base learning rate during training step ``step`` (0-indexed)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_scheduler must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
    if warmup_steps < 0 or step < 0:
        raise ValueError(f"warmup_steps and step must be >= 0, got {warmup_steps!r} and {step!r}")
    if schedule == "none":
        return 1.0
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    p = min(max((step - warmup_steps) / max(total_steps - 1 - warmup_steps, 1), 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * p
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


class LRSchedule:
    """``lr_factor`` bound to a config (reads the seed field names)."""

    def __init__(self, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
        self.schedule = schedule
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self(0)  # validate now rather than at the first step

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> LRSchedule:
        """From ``cfg.lr_scheduler``, ``warmup_steps``, ``number_of_steps``, ``min_lr_ratio``."""
        return cls(cfg.lr_scheduler, cfg.warmup_steps, cfg.number_of_steps, cfg.min_lr_ratio)

    def __call__(self, step: int) -> float:
        return lr_factor(
            step,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            min_lr_ratio=self.min_lr_ratio,
        )
