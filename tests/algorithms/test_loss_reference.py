"""Every algorithm × PPO clip × reference × TIS × aggregation against the NumPy reference."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from algorithms_reference import (
    ALGORITHMS,
    RATIO_ALGORITHMS,
    REINFORCE_FAMILY,
    Case,
    finite_difference_grad,
    kl_inference,
    packed_batch,
)
from algorithms_reference import loss as reference_loss
from helpers_torch import config_for, loss_inputs

from telescope.core.algorithms import LossInputs, StepMetrics, get_algorithm
from telescope.core.testing import make_config


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


ALL_CASES = _grid()
GRID = [c for c in ALL_CASES if c.valid]
REFUSED = [c for c in ALL_CASES if not c.valid]


def test_grid_is_complete() -> None:
    # 4 REINFORCE-style × 2 clip × 2 ref × 2 TIS, + dr_grpo's second aggregation (8), + 3 × 2 × 2,
    # less TIS on a ratio to the rollout policy: PPO clip (4 + dr_grpo's second aggregation) and
    # cispo, gspo, sapo (3).
    assert len(ALL_CASES) == 32 + 8 + 12
    assert len(REFUSED) == 5 + 3
    assert {c.algorithm for c in GRID} == set(ALGORITHMS)
    assert sum(c.use_tis and c.ppo_clip_ref_logprobs == "batch" for c in GRID) == 4 * 2 + 1 * 2 + 3


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_tis_on_a_rollout_ratio_is_refused_by_the_loss(case: Case) -> None:
    with pytest.raises(ValueError, match="double-counts.*set ppo_clip_ref_logprobs: batch"):
        get_algorithm(case.algorithm).policy_loss(loss_inputs(packed_batch(seed=1)), config_for(case))


@pytest.mark.parametrize("algorithm", RATIO_ALGORITHMS)
def test_tis_on_a_rollout_ratio_is_refused_by_config_validation(algorithm: str) -> None:
    from telescope.core.config.validate import registry_problems
    from telescope.core.plugins import load_plugins

    _, registry = load_plugins()
    bad = make_config(algorithm=algorithm, use_tis=True, ppo_clip_ref_logprobs="rollout")
    problems = registry_problems(bad, registry)
    assert any(
        f"algorithm '{algorithm}'" in p and "use_tis" in p and "set ppo_clip_ref_logprobs: batch" in p
        for p in problems
    ), problems
    good = make_config(algorithm=algorithm, use_tis=True, ppo_clip_ref_logprobs="batch")
    assert registry_problems(good, registry) == []


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
    case = Case("gspo", ppo_clip_ref_logprobs="batch", use_tis=True)
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
    r = np.exp(lp[on] - old[on])
    # PPO clip against the batch reference: TIS weighs π_old/μ (the ratio carries π/π_old).
    raw_w = np.exp(np.clip(old - mu, -case.tis_logprob_clamp, case.tis_logprob_clamp))[on]
    expected = {
        "loss_tokens": on.sum(),
        "kl_divergence_inference": kl_inference(lp, mu, mask),
        "entropy": inputs.entropy.numpy()[on].mean(),
        "clip_low_frac": np.mean((r < 1 - case.clip_low) & (adv[on] < 0)),
        "clip_high_frac": np.mean((r > 1 + case.clip_high) & (adv[on] > 0)),
        "tis_weight": np.minimum(raw_w, case.tis_cap).mean(),
        "tis_capped_frac": np.mean(raw_w > case.tis_cap),
    }
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), abs=1e-6), key
    assert not any(k.startswith("advantage") for k in got)  # the rollout records' advantage/* only


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
    case = Case("gspo", ppo_clip_ref_logprobs="batch", use_tis=True)
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


def test_tis_with_batch_reference_over_several_minibatches() -> None:
    """GRPO + PPO clip (batch reference) + TIS, two SGD minibatches on a softmax policy.

    Hand-computed: π = softmax(θ); old = log π before the step's first update; each minibatch's
    loss is the token mean of max(−rA, −clip(r)A) · min(exp(old − μ), cap), r = π/π_old, and
    d log π_y/dθ = onehot(y) − π. The second minibatch runs after θ moved, so there r ≠ 1 and a
    weight built from the current π (π/μ, not π_old/μ) would count π/π_old twice.
    """
    theta0 = np.array([0.2, -0.1, 0.5])
    tokens = np.array([0, 2, 1, 2])
    adv = np.array([1.0, -0.5, 0.8, 1.2])
    mu_gap = np.array([0.3, -0.2, 0.1, -0.4])  # log π_old − μ per token
    lr, cap, lo, hi = 0.5, 1.2, 0.8, 1.28
    minibatches = (np.array([0, 1]), np.array([2, 3]))

    def log_softmax(theta: np.ndarray) -> np.ndarray:
        return theta - np.log(np.exp(theta).sum())

    old = log_softmax(theta0)[tokens]
    mu = old - mu_gap
    weight = np.minimum(np.exp(old - mu), cap)

    # The hand computation.
    theta, expected_losses = theta0.copy(), []
    for idx in minibatches:
        probs = np.exp(log_softmax(theta))
        r = np.exp(log_softmax(theta)[tokens[idx]] - old[idx])
        a = adv[idx]
        clipped = np.clip(r, lo, hi)
        expected_losses.append(np.mean(np.maximum(-r * a, -clipped * a) * weight[idx]))
        # d/dθ of max(−rA, −clip(r)A): −A r (onehot − π) where the unclipped term is active, else 0.
        active = (-r * a) >= (-clipped * a)
        grad = np.zeros(3)
        for k, t in enumerate(idx):
            if active[k]:
                grad += -a[k] * r[k] * weight[t] * (np.eye(3)[tokens[t]] - probs) / len(idx)
        theta = theta - lr * grad
    assert not np.allclose(log_softmax(theta0), log_softmax(theta))  # the policy moved between minibatches

    # The implementation, on the same policy.
    cfg = make_config(
        use_ppo_clip=True,
        ppo_clip_ref_logprobs="batch",
        use_tis=True,
        tis_cap=cap,
        clip_low=1 - lo,
        clip_high=hi - 1,
    )
    param = torch.tensor(theta0, requires_grad=True)
    got_losses = []
    for idx in minibatches:
        lp = torch.log_softmax(param, dim=0)[torch.as_tensor(tokens[idx])]
        inputs = LossInputs(
            logprobs=lp,
            inference_logprobs=torch.as_tensor(mu[idx]),
            old_logprobs=torch.as_tensor(old[idx]),
            advantages=torch.as_tensor(adv[idx]),
            loss_mask=torch.ones(len(idx)),
            position_ids=torch.zeros(len(idx), dtype=torch.long),
            num_loss_tokens=len(idx),
            num_samples=len(idx),
        )
        out = get_algorithm("grpo").policy_loss(inputs, cfg)
        out.loss.backward()
        got_losses.append(float(out.loss.detach()))
        with torch.no_grad():
            param -= lr * param.grad
            param.grad = None
    np.testing.assert_allclose(got_losses, expected_losses, rtol=0, atol=1e-12)
    np.testing.assert_allclose(param.detach().numpy(), theta, rtol=0, atol=1e-12)
