"""``TELESCOPE_FAULTS=train_loss_nan@N``: the trainer backend of every rank trains step N, and only
step N, on NaN advantages (the health sentinel's ``nonfinite`` runs inject it into a real run)."""

from __future__ import annotations

import math

import pytest

from telescope.core import faults
from telescope.core.packing import MicroBatch, RankBatch
from telescope.core.runtime.supervision.faults import with_trainer_faults


class RecordingBackend:
    """Stands in for a trainer backend: keeps the advantages each step trained on."""

    def __init__(self) -> None:
        self.seen: list[list[float]] = []

    def train_step(self, batch: RankBatch) -> dict[str, float]:
        self.seen.append([a for row in batch.micro_batches for a in row.advantages])
        return {"loss": 0.0}


def batch(step: int) -> RankBatch:
    row = MicroBatch([1, 2, 3], [0, 1, 2], [0, 1, 1], [0.0, -0.5, -0.5], [0.0, 1.5, 1.5], [0, 0, 0], 1, 3)
    return RankBatch([row], step=step)


def test_step_n_trains_on_nan_advantages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "train_loss_nan@2")
    inner = RecordingBackend()
    backend = with_trainer_faults(inner)  # type: ignore[arg-type]
    for step in range(3):  # 0-indexed steps 0, 1, 2 = training steps 1, 2, 3
        backend.train_step(batch(step))
    first, second, third = inner.seen
    assert first == third == [0.0, 1.5, 1.5]
    assert all(math.isnan(a) for a in second)
    assert faults.parse("train_loss_nan@2").train_loss_nan == 2


def test_unset_no_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV_VAR, raising=False)
    inner = RecordingBackend()
    assert with_trainer_faults(inner) is inner  # type: ignore[arg-type]
