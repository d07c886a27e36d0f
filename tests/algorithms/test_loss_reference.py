"""Every algorithm × PPO clip × reference × TIS × aggregation against the NumPy reference."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from algorithms_reference import (
    ALGORITHMS,
    REINFORCE_FAMILY,
    Case,
    finite_difference_grad,
    kl_inference,
    packed_batch,
)
from algorithms_reference import loss as reference_loss
from helpers_torch import config_for, loss_inputs

from telescope.core.algorithms import StepMetrics, get_algorithm


def _grid() -> list[Case]:
    cases = []
    for algorithm in ALGORITHMS:
        clips = (False, True) if algorithm in REINFORCE_FAMILY else (False,)
        aggs = ("token_mean", "token_sum_norm") if algorithm == "dr_grpo" else ("token_mean",)
        for clip in clips:
            for ref in ("rollout", "batch"):
                for tis in (False, True):
                    for agg in aggs:
                        norm = "batch" if algorithm == "reinforce_pp" else "group"
                        cases.append(Case(algorithm, clip, ref, tis, agg, advantage_norm=norm))
    return cases


GRID = _grid()


def test_grid_is_complete() -> None:
    # 4 REINFORCE-style × 2 clip × 2 ref × 2 TIS, + dr_grpo's second aggregation (8), + 3 × 2 × 2.
    assert len(GRID) == 32 + 8 + 12
    assert {c.algorithm for c in GRID} == set(ALGORITHMS)


@pytest.mark.parametrize("case", GRID, ids=[c.id for c in GRID])
def test_loss_and_gradient_match_reference(case: Case) -> None:
    batch = packed_batch(seed=zlib.crc32(case.id.encode()))
    # The minibatch is larger than this micro-batch: the denominators come from outside.
    num_loss_tokens, num_samples = float(batch["mask"].sum()) + 17.0, batch["num_samples"] + 2
    inputs = loss_inputs(batch, num_loss_tokens=num_loss_tokens, num_samples=num_samples)
    out = get_algorithm(case.algorithm).policy_loss(inputs, config_for(case))
    out.loss.backward()

    args = (batch["lp"], batch["mu"], batch["old"], batch["adv"], batch["mask"], batch["pos"], case)
    expected = reference_loss(batch["lp"], *args, num_loss_tokens, num_samples)
    assert abs(float(out.loss.detach()) - expected) < 1e-6
    fd = finite_difference_grad(*args, num_loss_tokens, num_samples)
    np.testing.assert_allclose(inputs.logprobs.grad.numpy(), fd, rtol=0, atol=1e-6)
    # Not vacuous: the loss reached the logprobs (masked tokens get exactly no gradient).
    assert np.abs(fd).max() > 1e-3
    assert np.all(inputs.logprobs.grad.numpy()[batch["mask"] == 0] == 0)


@pytest.mark.parametrize("case", [c for c in GRID if c.use_tis or c.use_ppo_clip or c.algorithm == "cispo"])
def test_grid_exercises_clipping_and_tis(case: Case) -> None:
    """The random inputs do hit the clip bounds and the TIS cap (else the grid proves little)."""
    batch = packed_batch(seed=zlib.crc32(case.id.encode()))
    metrics = StepMetrics()
    metrics.add(get_algorithm(case.algorithm).policy_loss(loss_inputs(batch), config_for(case)).metrics)
    result = metrics.result()
    if case.use_tis:
        assert 0 < result["tis_capped_frac"] < 1
    if case.use_ppo_clip or case.algorithm == "cispo":
        assert result["clip_low_frac"] + result["clip_high_frac"] > 0


def test_float32_logprobs_match_reference_closely() -> None:
    case = Case("gspo", use_tis=True)
    batch = packed_batch(seed=3)
    inputs = loss_inputs(batch)
    for name in ("logprobs", "inference_logprobs", "old_logprobs", "advantages"):
        setattr(inputs, name, getattr(inputs, name).detach().float())
    inputs.logprobs.requires_grad_(True)
    out = get_algorithm("gspo").policy_loss(inputs, config_for(case))
    args = (batch["lp"], batch["mu"], batch["old"], batch["adv"], batch["mask"], batch["pos"], case)
    expected = reference_loss(batch["lp"], *args, float(batch["mask"].sum()), batch["num_samples"])
    assert out.loss.dtype == torch.float32
    assert abs(float(out.loss.detach()) - expected) < 1e-5 * max(1.0, abs(expected))


def test_metrics_match_reference() -> None:
    case = Case("grpo", use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True)
    batch = packed_batch(seed=11)
    lp, mu, old, adv, mask = (batch[k] for k in ("lp", "mu", "old", "adv", "mask"))
    inputs = loss_inputs(batch)
    inputs.entropy = torch.linspace(0.5, 2.0, len(lp), dtype=torch.float64)
    metrics = StepMetrics()
    metrics.add(get_algorithm("grpo").policy_loss(inputs, config_for(case)).metrics)
    got = metrics.result()

    on = mask > 0
    r = np.exp(old[on] * 0 + lp[on] - old[on])
    raw_w = np.exp(np.clip(lp - mu, -case.tis_logprob_clamp, case.tis_logprob_clamp))[on]
    expected = {
        "loss_tokens": on.sum(),
        "kl_divergence_inference": kl_inference(lp, mu, mask),
        "entropy": inputs.entropy.numpy()[on].mean(),
        "advantage_mean": adv[on].mean(),
        "advantage_std": adv[on].std(ddof=0),
        "advantage_min": adv[on].min(),
        "advantage_max": adv[on].max(),
        "clip_low_frac": np.mean((r < 1 - case.clip_low) & (adv[on] < 0)),
        "clip_high_frac": np.mean((r > 1 + case.clip_high) & (adv[on] > 0)),
        "tis_weight": np.minimum(raw_w, case.tis_cap).mean(),
        "tis_capped_frac": np.mean(raw_w > case.tis_cap),
    }
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), abs=1e-6), key


def test_token_sum_norm_only_changes_dr_grpo() -> None:
    """``dr_grpo_loss_agg_mode`` is DR-GRPO's option: other algorithms keep the token mean."""
    batch = packed_batch(seed=21)
    losses = {}
    for mode in ("token_mean", "token_sum_norm"):
        for algorithm in ("grpo", "dr_grpo"):
            cfg = config_for(Case(algorithm, dr_grpo_loss_agg_mode=mode))
            losses[algorithm, mode] = float(
                get_algorithm(algorithm).policy_loss(loss_inputs(batch), cfg).loss.detach()
            )
    assert losses["grpo", "token_mean"] == losses["grpo", "token_sum_norm"] == losses["dr_grpo", "token_mean"]
    # Σ m_t L_t / (N · max_tokens) instead of / Σ m_t.
    tokens, samples, max_tokens = batch["mask"].sum(), batch["num_samples"], Case("dr_grpo").max_tokens
    ratio = losses["dr_grpo", "token_sum_norm"] / losses["dr_grpo", "token_mean"]
    assert ratio == pytest.approx(tokens / (samples * max_tokens), rel=1e-9)


def test_bool_mask_and_int32_positions_are_accepted() -> None:
    case = Case("gspo", use_tis=True)
    batch = packed_batch(seed=4)
    expected = float(get_algorithm("gspo").policy_loss(loss_inputs(batch), config_for(case)).loss.detach())
    inputs = loss_inputs(batch)
    inputs.loss_mask = inputs.loss_mask.bool()
    inputs.position_ids = inputs.position_ids.int()
    assert float(get_algorithm("gspo").policy_loss(inputs, config_for(case)).loss.detach()) == expected


def test_ppo_clip_on_a_ratio_algorithm_is_refused_by_the_loss_too() -> None:
    with pytest.raises(ValueError, match="use_ppo_clip is not supported by algorithm 'cispo'"):
        get_algorithm("cispo").policy_loss(
            loss_inputs(packed_batch(seed=1)), config_for(Case("cispo", use_ppo_clip=True))
        )
