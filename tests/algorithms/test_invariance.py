"""Packing and rank invariance: the minibatch loss, gradient and metrics do not depend on how
samples are packed into micro-batches or split across data-parallel ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algorithms_reference import Case
from helpers_torch import config_for

from telescope.core.algorithms import LossInputs, StepMetrics, get_algorithm

CASES = [
    Case("grpo", use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True),
    Case("rloo", use_ppo_clip=True),
    Case("reinforce_pp", advantage_norm="batch", use_tis=True),
    Case("dr_grpo", dr_grpo_loss_agg_mode="token_sum_norm", use_tis=True),
    Case("dr_grpo", use_ppo_clip=True, ppo_clip_ref_logprobs="batch"),
    Case("cispo", ppo_clip_ref_logprobs="batch", use_tis=True),
    Case("gspo", ppo_clip_ref_logprobs="batch", use_tis=True),
    Case("sapo", ppo_clip_ref_logprobs="batch", use_tis=True),
]


def _samples(seed: int, count: int = 7) -> list[dict[str, torch.Tensor]]:
    """Independent samples: a prompt (masked) then a completion, one advantage each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n, p = int(rng.integers(4, 12)), int(rng.integers(1, 4))
        lp = -np.abs(rng.normal(1.0, 0.6, n))
        out.append(
            {
                "lp": torch.tensor(lp, requires_grad=True),
                "mu": torch.tensor(lp + rng.normal(0, 0.3, n)),
                "old": torch.tensor(lp + rng.normal(0, 0.3, n)),
                "adv": torch.full((n,), float(rng.normal()), dtype=torch.float64),
                "mask": torch.tensor(np.r_[np.zeros(p), np.ones(n - p)]),
                "pos": torch.arange(n),
            }
        )
    return out


def _micro_batch(samples, pad: int, num_loss_tokens: float, num_samples: int) -> LossInputs:
    def cat(key: str, fill: float) -> torch.Tensor:
        padding = torch.full((pad,), fill, dtype=samples[0][key].dtype)
        return torch.cat([s[key] for s in samples] + [padding])

    return LossInputs(
        logprobs=cat("lp", -1.0),
        inference_logprobs=cat("mu", -1.0),
        old_logprobs=cat("old", -1.0),
        advantages=cat("adv", 0.0),
        loss_mask=cat("mask", 0.0),
        position_ids=torch.cat([torch.cat([s["pos"] for s in samples]), torch.arange(pad)]),
        num_loss_tokens=num_loss_tokens,
        num_samples=num_samples,
    )


def _run(case: Case, samples, layout: list[list[list[int]]]):
    """Total loss, per-sample gradients and step metrics for ``layout[rank][micro][sample index]``."""
    for s in samples:
        s["lp"].grad = None
    tokens = float(sum(s["mask"].sum() for s in samples))
    algorithm, cfg, total, metrics = get_algorithm(case.algorithm), config_for(case), 0.0, StepMetrics()
    for rank_micro_batches in layout:
        for i, micro in enumerate(rank_micro_batches):
            inputs = _micro_batch([samples[k] for k in micro], i + 1, tokens, len(samples))
            out = algorithm.policy_loss(inputs, cfg)
            out.loss.backward()
            total += float(out.loss.detach())
            metrics.add(out.metrics)
    return total, [s["lp"].grad.clone() for s in samples], metrics.result()


LAYOUTS = {
    "one_micro_batch": [[[0, 1, 2, 3, 4, 5, 6]]],
    "three_micro_batches_shuffled": [[[6, 2], [0, 5, 3], [4, 1]]],
    "two_ranks": [[[1, 3], [5]], [[0, 2, 6], [4]]],
    "one_sample_each": [[[k] for k in range(7)]],
}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_loss_gradient_and_metrics_do_not_depend_on_packing(case: Case) -> None:
    samples = _samples(seed=len(case.id))
    base_loss, base_grads, base_metrics = _run(case, samples, LAYOUTS["one_micro_batch"])
    assert abs(base_loss) > 1e-4
    for name, layout in LAYOUTS.items():
        loss, grads, metrics = _run(case, samples, layout)
        assert loss == pytest.approx(base_loss, abs=1e-12), name
        for g, g0 in zip(grads, base_grads, strict=True):
            torch.testing.assert_close(g, g0, rtol=0, atol=1e-12)
        assert metrics.keys() == base_metrics.keys()
        for key, value in base_metrics.items():
            assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, key)
