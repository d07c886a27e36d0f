"""The trainer-backend interface and the data the orchestrator hands to it.

Torch-free: the orchestrator builds ``TrainSample`` objects, packs them with
``telescope.core.packing.Packer`` (where both records are defined) and sends each trainer rank a ``RankBatch`` (its own rows
plus batch-wide packing statistics). A backend (``fsdp``, ``megatron``, or a plugin's)
implements ``TrainerBackend``.

Call order on every rank of the trainer group (all ranks must make the same calls, since
they run collectives): ``init()`` once, then per step ``train_step(batch)`` and
``iter_weights_for_inference()`` (fully consumed on every rank), and when asked
``save_checkpoint(dir, training_state=...)`` / ``load_checkpoint(dir, training_state=...)``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from telescope.core.packing import RankBatch, TrainSample

__all__ = ["RankBatch", "TrainSample", "TrainerBackend"]


class TrainerBackend(abc.ABC):
    """A distributed trainer: one instance per trainer rank."""

    @abc.abstractmethod
    def init(self) -> dict[str, Any]:
        """Join the process group, build model, optimizer and scheduler.

        Returns rank information (``rank``, ``world_size``, ``dp_rank``, ``dp_world_size``,
        ``device``).
        """

    @abc.abstractmethod
    def train_step(self, batch: RankBatch) -> dict[str, float]:
        """One RL training step on this rank's rows; returns step metrics (same on all ranks).

        Keys follow the step-metrics doc: ``entropy``, ``kl_divergence_inference``,
        ``grad_norm``, ``learning_rate``, ``loss``, ``timing_*_total`` and
        ``timing_*_microbatch_mean``, plus ``section/metric`` extras.
        """

    @abc.abstractmethod
    def iter_weights_for_inference(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(hf_name, full_tensor)`` one parameter at a time on the broadcast rank.

        Every rank must iterate to the end (other ranks take part in the gathers and yield
        nothing). The whole model is never materialised at once.
        """

    @abc.abstractmethod
    def save_checkpoint(self, directory: str, *, training_state: bool = True) -> None:
        """Write this trainer's part of a checkpoint into ``directory`` (collective: every rank).

        Always: the model (sharded, HF parameter names), ``trainer_state.pt`` (step and
        counters), ``trainer_meta.json``, each rank's RNG states and ``hf_meta/``. With
        ``training_state`` also the optimizer and LR scheduler, so a resume continues exactly.
        ``directory`` exists and is empty (``CheckpointManager.begin``); the caller commits it.
        See ``telescope.core.checkpoint.layout`` for the file names.
        """

    @abc.abstractmethod
    def load_checkpoint(self, directory: str, *, training_state: bool = True) -> dict[str, Any]:
        """Restore what ``save_checkpoint`` wrote (collective); returns at least
        ``{"step": <completed training steps>, "training_state": <restored optimizer/scheduler?>}``.

        ``training_state=False`` loads the weights only. A weights-only checkpoint loaded with
        ``training_state=True`` loads the weights, starts the optimizer fresh, sets the LR
        scheduler to the saved step, logs a warning and returns ``training_state: False``.
        """

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """Global rank in the trainer group."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """Number of trainer ranks."""

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (which ``PackedBatch.per_rank`` entry this rank trains on)."""
        return self.rank

    @property
    def dp_world_size(self) -> int:
        """Data-parallel world size (the packer's ``dp_world_size``)."""
        return self.world_size

    @property
    def is_weight_broadcast_rank(self) -> bool:
        """True on the rank whose ``iter_weights_for_inference`` yields tensors."""
        return self.rank == 0
