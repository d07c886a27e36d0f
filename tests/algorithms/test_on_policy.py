"""On-policy identities (ℓ = ref = μ) and zero advantages, for every algorithm and option."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algorithms_reference import ALGORITHMS, REINFORCE_FAMILY, Case, packed_batch, segments
from helpers_torch import config_for, loss_inputs

from telescope.core.algorithms import get_algorithm, token_logprobs


def _cases() -> list[Case]:
    cases = []
    for a in ALGORITHMS:
        for clip in (False, True) if a in REINFORCE_FAMILY else (False,):
            for ref in ("rollout", "batch"):
                case = Case(a, use_ppo_clip=clip, ppo_clip_ref_logprobs=ref, use_tis=True)
                cases.append(case if case.valid else Case(a, use_ppo_clip=clip, ppo_clip_ref_logprobs=ref))
    return cases


CASES = _cases()


def _on_policy(batch: dict) -> dict:
    return {**batch, "mu": batch["lp"].copy(), "old": batch["lp"].copy()}


def _expected_gradient(batch: dict, algorithm: str, n_tokens: float) -> np.ndarray:
    """−A_t / N on loss tokens; GSPO: −Â_i / (|T_i| N)."""
    adv, mask = batch["adv"], batch["mask"]
    if algorithm != "gspo":
        return -adv * mask / n_tokens
    grad = np.zeros_like(adv)
    for seg in segments(batch["pos"]):
        t_i = seg[mask[seg] > 0]
        if len(t_i):
            grad[t_i] = -adv[t_i].mean() / (len(t_i) * n_tokens)
    return grad


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_on_policy_gradient_is_the_policy_gradient(case: Case) -> None:
    batch = _on_policy(packed_batch(seed=5))
    n_tokens = float(batch["mask"].sum()) + 9.0
    inputs = loss_inputs(batch, num_loss_tokens=n_tokens)
    get_algorithm(case.algorithm).policy_loss(inputs, config_for(case)).loss.backward()
    expected = _expected_gradient(batch, case.algorithm, n_tokens)
    np.testing.assert_allclose(inputs.logprobs.grad.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_on_policy_parameter_gradient_through_token_logprobs(algorithm: str) -> None:
    """End to end through a tiny linear 'model': ∇W loss = ∇W of the REINFORCE surrogate."""
    torch.manual_seed(0)
    batch = packed_batch(seed=9, per_sample_adv=True)
    n = len(batch["lp"])
    hidden, weight = (
        torch.randn(n, 8, dtype=torch.float64),
        torch.randn(8, 16, dtype=torch.float64, requires_grad=True),
    )
    targets = torch.randint(0, 16, (n,))
    lp = token_logprobs(hidden @ weight, targets, temperature=0.7, chunk_size=5)
    batch = {**batch, "lp": lp.detach().numpy(), "mu": lp.detach().numpy(), "old": lp.detach().numpy()}
    n_tokens = float(batch["mask"].sum())
    inputs = loss_inputs(batch, lp=lp, num_loss_tokens=n_tokens)
    get_algorithm(algorithm).policy_loss(
        inputs, config_for(Case(algorithm, ppo_clip_ref_logprobs="batch", use_tis=True))
    ).loss.backward()
    got = weight.grad.clone()

    weight.grad = None
    coef = torch.as_tensor(-_expected_gradient(batch, algorithm, n_tokens))
    surrogate = -(coef * token_logprobs(hidden @ weight, targets, temperature=0.7, chunk_size=5)).sum()
    surrogate.backward()
    torch.testing.assert_close(got, weight.grad, rtol=0, atol=1e-6)
    assert got.abs().max() > 1e-3


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_zero_advantages_give_zero_loss_and_gradient(case: Case) -> None:
    batch = {**packed_batch(seed=13), "adv": np.zeros(len(packed_batch(seed=13)["lp"]))}
    inputs = loss_inputs(batch)  # off-policy inputs: ratios away from 1
    out = get_algorithm(case.algorithm).policy_loss(inputs, config_for(case))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert torch.count_nonzero(inputs.logprobs.grad) == 0
