"""From scored groups to a packed training batch: advantages, stage-2 normalisation, packing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from telescope.core.algorithms.distill import DistillSignal, check_algorithm
from telescope.core.packing import Packer
from telescope.core.rollouts.distill import train_samples
from telescope.core.rollouts.groups import RolloutGroup
from telescope.core.trainer import RankBatch

if TYPE_CHECKING:
    from telescope.core.algorithms.base import Algorithm
    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.teacher import TeacherCounts

__all__ = ["BatchBuilder", "GroupBucket", "TrainBatch"]


@dataclass
class TrainBatch:
    """One step's data: a ``RankBatch`` per data-parallel rank, and the groups it came from."""

    step: int
    per_rank: list[RankBatch]
    groups: list[RolloutGroup]
    metrics: dict[str, float] = field(default_factory=dict)


class GroupBucket:
    """Finished groups waiting for a batch: ``size`` of them make one, too old ones are discarded."""

    def __init__(self, size: int, max_async_rollout: int) -> None:
        self.size = size
        self.max_async_rollout = max_async_rollout
        self.groups: list[RolloutGroup] = []
        # The first ``_checked`` groups are known to be young enough at step ``_checked_step``: a
        # group's age only changes with the step, so between steps only new arrivals are checked
        # (a driver with thousands of groups waiting would otherwise rescan them all per arrival).
        self._checked = 0
        self._checked_step: int | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: RolloutGroup) -> None:
        self.groups.append(group)

    def drop_too_old(self, step: int) -> list[RolloutGroup]:
        """Remove the groups generated more than ``max_async_rollout`` versions before ``step``;
        returns them, with discard reason ``max_async``."""
        start = self._checked if step == self._checked_step else 0
        unchecked = self.groups[start:]
        old = [g for g in unchecked if step - g.oldest_version > self.max_async_rollout]
        if old:
            young = [g for g in unchecked if step - g.oldest_version <= self.max_async_rollout]
            self.groups = self.groups[:start] + young
        self._checked, self._checked_step = len(self.groups), step
        for group in old:
            group.discard_reason = "max_async"
        return old

    def take(self) -> list[RolloutGroup] | None:
        """The groups of the next batch in group-id order (it does not depend on completion order),
        or None while fewer than ``size`` are waiting."""
        if len(self.groups) < self.size:
            return None
        groups, self.groups = self.groups[: self.size], self.groups[self.size :]
        self._checked = max(0, self._checked - self.size)
        return sorted(groups, key=lambda g: g.group_id)


class BatchBuilder:
    """Computes advantages with the run's algorithm and packs batches for the trainer."""

    def __init__(self, cfg: TelescopeConfig, algorithm: Algorithm, pad_token_id: int) -> None:
        self.cfg = cfg
        self.algorithm = algorithm
        self.pad_token_id = pad_token_id
        self._packer: Packer | None = None
        self.distill = DistillSignal.from_config(cfg)
        """The teacher's share of each token's advantage (None: the reward's advantage alone)."""
        self.teacher_counts: TeacherCounts | None = None
        """The teacher's cumulative requests, retries and failures (reported with every batch)."""
        if self.distill is not None:
            check_algorithm(algorithm)

    def assign_advantages(self, group: RolloutGroup) -> None:
        """Stage-1 advantages of one finished group (written onto its samples)."""
        import torch

        rewards = torch.tensor([group.rewards], dtype=torch.float64)
        advantages = self.algorithm.compute_advantages(rewards, self.cfg)[0].tolist()
        for sample, advantage in zip(group.samples, advantages, strict=True):
            sample.advantage = float(advantage)

    def build(self, groups: list[RolloutGroup], dp_world_size: int, step: int) -> TrainBatch:
        """Stage-2 normalisation over the batch (when the algorithm uses it), then packing."""
        import torch

        samples = [s for g in groups for s in g.samples]
        stage1 = torch.tensor([s.advantage for s in samples], dtype=torch.float64)
        final = self.algorithm.normalize_batch_advantages(stage1, self.cfg).tolist()
        for sample, advantage in zip(samples, final, strict=True):
            sample.advantage = float(advantage)
        train, distill_metrics = train_samples(samples, self.distill)
        packed = self._packer_for(dp_world_size).pack(train)
        per_rank = [RankBatch.from_packed(packed, rank, step) for rank in range(dp_world_size)]
        metrics = dict(packed.metrics()) | distill_metrics
        if self.teacher_counts is not None:
            metrics |= self.teacher_counts.metrics()
        metrics["batch/num_samples"] = float(len(samples))
        metrics["batch/num_tokens"] = float(sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples))
        return TrainBatch(step, per_rank, groups, metrics)

    def _packer_for(self, dp_world_size: int) -> Packer:
        if self._packer is None or self._packer.dp_world_size != dp_world_size:
            self._packer = Packer(
                self.cfg.seq_len,
                self.cfg.pad_to_multiple_of,
                dp_world_size,
                num_minibatches=self.cfg.number_of_minibatches,
                pad_token_id=self.pad_token_id,
            )
        return self._packer
