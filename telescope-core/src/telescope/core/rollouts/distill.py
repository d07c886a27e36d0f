"""On-policy distillation in the rollout path: the teacher scores each finished sample, the batch
turns the scores into per-token advantages (``algorithms.distill``).

``DistillRunner`` is a ``RolloutRunner`` that, once a sample is generated and scored, asks the
teacher (``inference.teacher.TeacherClient``) for the logprobs of its sampled completion tokens,
for the sample's own sequence and each extra segment of an agent's rollout. Other samples keep
generating meanwhile, and the teacher client batches the sequences that arrive together. A teacher
that fails after its retries raises an infrastructure failure (``teacher_error``): the sample runs
again, then is masked (its group trains on the others), never trained with a missing signal.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.algorithms.distill import DistillSignal, DistillStats, token_advantages
from telescope.core.inference.teacher import TeacherClient, TeacherSequence
from telescope.core.rollouts.groups import RolloutSample
from telescope.core.rollouts.rollout import RolloutRunner, SampleTask
from telescope.core.trainer import TrainSample

if TYPE_CHECKING:
    from telescope.core.inference.server_client import ServerClient

__all__ = ["DistillRunner", "train_samples"]


class DistillRunner(RolloutRunner):
    """A ``RolloutRunner`` whose samples come back with the teacher's logprobs (``teacher_logprobs``)."""

    teacher: TeacherClient
    on_close: Callable[[], Awaitable[None]] | None = None
    """Stops what serves the teacher (its pool), when the run ends."""

    @classmethod
    def around(
        cls,
        runner: RolloutRunner,
        teacher: TeacherClient,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> DistillRunner:
        """``runner``'s settings, with ``teacher`` scoring every sample."""
        out = cls(runner.tokenizer, runner.settings, runner.interleaver)
        out.agent_gateway, out.teacher, out.on_close = runner.agent_gateway, teacher, on_close
        return out

    async def close(self) -> None:
        """Close the teacher's client, and its pool when the run started one."""
        await self.teacher.close()
        if self.on_close is not None:
            await self.on_close()

    async def run(
        self, client: ServerClient, task: SampleTask, on_generated: Callable[[], None]
    ) -> RolloutSample:
        sample = await super().run(client, task, on_generated)
        started = time.time()
        sequences = [TeacherSequence(sample.prompt_ids, sample.completion_ids)]
        sequences += [TeacherSequence(seg.prompt_ids, seg.completion_ids) for seg in sample.extra_segments]
        sample.teacher_logprobs = await self.teacher.score(sequences)
        sample.timings["teacher_s"] = time.time() - started
        return sample


@dataclass(frozen=True)
class _Trained:
    """One trained sequence of a sample (its own, or an extra segment)."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    logprobs: Sequence[float]
    loss_mask: Sequence[int] | None


def _sequences(sample: RolloutSample) -> list[_Trained]:
    own = _Trained(sample.prompt_ids, sample.completion_ids, sample.inference_logprobs, sample.loss_mask)
    segments = [
        _Trained(seg.prompt_ids, seg.completion_ids, seg.logprobs, [int(m) for m in seg.loss_mask])
        for seg in sample.extra_segments
    ]
    return [own, *segments]


def train_samples(
    samples: list[RolloutSample], signal: DistillSignal | None
) -> tuple[list[TrainSample], dict[str, float]]:
    """The batch's ``TrainSample`` s (each sample's own sequence first, then every extra segment: an
    agent's rewritten histories, trained with their rollout's advantage) and the ``distill/*`` metrics.

    Without a teacher a token's advantage is its sample's; with one it is
    ``reward_weight · advantage + kl_coef · (teacher_t − student_t)`` (``algorithms.distill``).
    """
    stats = DistillStats(teacher_seconds=[]) if signal is not None else None
    own: list[TrainSample] = []
    segments: list[TrainSample] = []
    for sample in samples:
        teacher: list[Any] = _teacher_logprobs(sample) if signal is not None else []
        for k, seq in enumerate(_sequences(sample)):
            train = TrainSample(
                seq.prompt_ids, seq.completion_ids, seq.logprobs, sample.advantage, seq.loss_mask
            )
            if signal is not None and stats is not None:
                train.advantage = signal.reward_weight * sample.advantage
                train.token_advantages = token_advantages(
                    seq.logprobs, teacher[k], seq.loss_mask, signal.kl_coef
                )
                stats.add(seq.logprobs, teacher[k], seq.loss_mask)
            (own if k == 0 else segments).append(train)
        if stats is not None and stats.teacher_seconds is not None and "teacher_s" in sample.timings:
            stats.teacher_seconds.append(sample.timings["teacher_s"])
    return own + segments, stats.metrics() if stats is not None else {}


def _teacher_logprobs(sample: RolloutSample) -> list[list[float]]:
    expected = 1 + len(sample.extra_segments)
    if sample.teacher_logprobs is None or len(sample.teacher_logprobs) != expected:
        got = "none" if sample.teacher_logprobs is None else len(sample.teacher_logprobs)
        raise ValueError(
            f"a sample of a distillation run carries teacher logprobs for {got} sequence(s), not {expected}: "
            "every trained sequence must be scored by the teacher (rollouts.distill.DistillRunner)"
        )
    return sample.teacher_logprobs
