"""On-policy distillation end to end: Ray, the policy's and the teacher's transformers servers (the
teacher on its own pool), FSDP with LoRA and two minibatches, the tiny model.

The teacher is the policy's own starting model, so at step 1 (samples of the initial weights; LoRA
starts as a zero update) the teacher's logprob of every sampled token equals the logprob the policy
sampled it with: the reverse KL is 0 up to float noise. Scoring the prompt's tokens, a shifted
position or another id than the sampled one gives a KL far from 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from rundriver import read_jsonl, train_to_end

pytest.importorskip("ray")


@pytest.mark.slow
def test_a_teacher_equal_to_the_initial_policy_gives_zero_reverse_kl_at_step_one(tmp_path: Path) -> None:
    run_dir = train_to_end(
        tmp_path,
        distill_teacher_model="telescope/tiny",
        distill_kl_coef=1.0,
        distill_reward_weight=1.0,
        lora_rank=4,
        number_of_minibatches=2,
    )
    steps = [row["metrics"] for row in read_jsonl(run_dir / "metrics.jsonl")]
    assert len(steps) == 2
    first = steps[0]
    assert abs(first["distill/reverse_kl"]) < 1e-4, first["distill/reverse_kl"]
    for metrics in steps:
        assert (
            math.isfinite(metrics["distill/teacher_logprob_mean"])
            and metrics["distill/teacher_logprob_mean"] < 0
        )
        assert metrics["distill/teacher_seconds"] > 0
        assert metrics["distill/teacher_failures"] == 0 and metrics["distill/teacher_requests"] >= 1
    assert (run_dir / "logs" / "teacher").is_dir()  # the teacher ran on its own servers
