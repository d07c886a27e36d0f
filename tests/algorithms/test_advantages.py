"""Stage-1 and stage-2 advantages against the NumPy reference, through the config dispatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algorithms_reference import ALGORITHMS, advantages, whiten

from telescope.core.algorithms import compute_advantages, get_algorithm, normalize_batch_advantages
from telescope.core.testing import make_config

DEFAULT_NORM = {"reinforce_pp": "batch"}


def _cfg(algorithm: str, norm: str | None = None):
    return make_config(algorithm=algorithm, advantage_norm=norm or DEFAULT_NORM.get(algorithm, "group"))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("group_size", [1, 2, 5])
def test_stage_one_matches_reference(algorithm: str, group_size: int) -> None:
    rewards = np.random.default_rng(group_size).normal(size=(4, group_size))
    rewards[1] = 0.5  # a group with identical rewards: 0 advantage (or the raw reward, batch mode n=1)
    norm = DEFAULT_NORM.get(algorithm, "group")
    got = compute_advantages(torch.tensor(rewards), _cfg(algorithm))
    assert got.shape == rewards.shape and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), advantages(rewards, algorithm, norm), rtol=0, atol=1e-9)


def test_hand_computed_values() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    # mean 0.5, sample std sqrt(1/3) = 0.57735.
    grpo = compute_advantages(rewards, _cfg("grpo"))
    assert grpo[0, 0].item() == pytest.approx(0.5 / (0.5773503 + 1e-4), rel=1e-6)
    rloo = compute_advantages(rewards, _cfg("rloo"))  # r_i - mean of the other three
    assert rloo[0].tolist() == pytest.approx([1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3])
    assert compute_advantages(rewards, _cfg("dr_grpo"))[0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert compute_advantages(torch.tensor([[3.0]]), _cfg("reinforce_pp")).item() == 3.0
    assert compute_advantages(torch.tensor([[3.0]]), _cfg("grpo")).item() == 0.0


@pytest.mark.parametrize("algorithm", ["grpo", "cispo", "gspo", "sapo", "reinforce_pp"])
def test_batch_norm_is_centering_then_whitening(algorithm: str) -> None:
    rewards = np.random.default_rng(7).normal(size=(6, 4))
    cfg = _cfg(algorithm, "batch")
    stage1 = compute_advantages(torch.tensor(rewards), cfg)
    np.testing.assert_allclose(stage1.numpy(), advantages(rewards, algorithm, "batch"), atol=1e-9)
    stage2 = normalize_batch_advantages(stage1, cfg)
    np.testing.assert_allclose(stage2.numpy(), whiten(stage1.numpy()), atol=1e-9)
    # A flat list of per-sample advantages is accepted too (the orchestrator's layout).
    flat = normalize_batch_advantages(stage1.reshape(-1), cfg)
    np.testing.assert_allclose(flat.numpy(), stage2.reshape(-1).numpy(), atol=1e-12)


def test_group_norm_leaves_stage_two_alone() -> None:
    a = torch.tensor([[0.3, -0.3], [1.0, -1.0]])
    assert torch.equal(normalize_batch_advantages(a, _cfg("grpo", "group")), a)


def test_disallowed_norm_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="advantage_norm 'batch' is not supported by algorithm 'rloo'"):
        get_algorithm("rloo").compute_advantages(torch.ones(2, 2), _cfg("rloo", "batch"))
    with pytest.raises(ValueError, match="allowed: batch"):
        get_algorithm("reinforce_pp").compute_advantages(torch.ones(2, 2), _cfg("reinforce_pp", "group"))


def test_bad_rewards_are_named() -> None:
    with pytest.raises(ValueError, match="NaN or inf"):
        compute_advantages(torch.tensor([[1.0, float("nan")]]), _cfg("grpo"))
    with pytest.raises(ValueError, match=r"\[num_groups, group_size\]"):
        compute_advantages(torch.ones(4), _cfg("grpo"))
    # Integer rewards are promoted to float.
    assert compute_advantages([[1, 0]], _cfg("dr_grpo")).tolist() == [[0.5, -0.5]]
