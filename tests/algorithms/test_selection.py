"""Choosing an algorithm by name: built-ins, config errors, and a plugin-registered eighth one."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from algorithms_reference import ALGORITHMS

from telescope.core import hookimpl
from telescope.core.algorithms import (
    Algorithm,
    LossInputs,
    compute_advantages,
    get_algorithm,
    normalize_batch_advantages,
    policy_loss,
)
from telescope.core.algorithms.base import TokenLosses
from telescope.core.config import ConfigError, load_config
from telescope.core.registry import UnknownComponentError
from telescope.core.testing import registry_with


class MedianBaseline(Algorithm):
    """A third-party algorithm: median-centred advantages and a doubled REINFORCE loss."""

    name = "median_baseline"
    supports_ppo_clip = False
    advantage_norms = ("group",)

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards - rewards.median(dim=-1, keepdim=True).values

    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: Any) -> TokenLosses:
        return TokenLosses(losses=-2.0 * inputs.logprobs * inputs.advantages)


class RunSupport:
    """What a config needs besides an algorithm: an environment and a trainer backend name."""

    @hookimpl
    def telescope_register_environments(self, register):  # type: ignore[no-untyped-def]
        register.add("reverse_text", "x:y")

    @hookimpl
    def telescope_register_trainer_backends(self, register):  # type: ignore[no-untyped-def]
        register.add("fsdp", "x:y")


class ThirdParty:
    @hookimpl
    def telescope_register_algorithms(self, register):  # type: ignore[no-untyped-def]
        register.add(
            "median_baseline",
            MedianBaseline,
            description="median baseline",
            supports_ppo_clip=False,
            advantage_norms=("group",),
            default_advantage_norm="group",
        )
        register.add("not_an_algorithm", dict)


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    return registry_with(("support", RunSupport()), ("third_party", ThirdParty()))[1]


def _load(registry, **fields):  # type: ignore[no-untyped-def]
    fields.setdefault("environments", [{"name": "reverse_text"}])
    return load_config(None, fields, registry)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_builtin_is_selectable_by_name(registry, name: str) -> None:  # type: ignore[no-untyped-def]
    cfg = _load(registry, algorithm=name)
    algorithm = get_algorithm(cfg.algorithm, registry)
    assert algorithm.name == name
    assert cfg.advantage_norm == algorithm.default_advantage_norm
    meta = registry.get("algorithm", name).meta
    assert meta == {
        "supports_ppo_clip": algorithm.supports_ppo_clip,
        "advantage_norms": algorithm.advantage_norms,
        "default_advantage_norm": algorithm.default_advantage_norm,
        "uses_ratio": algorithm.uses_ratio,
        "token_advantages": algorithm.supports_token_advantages,
    }
    rewards = torch.tensor([[1.0, 0.0, 0.0]])
    a = normalize_batch_advantages(compute_advantages(rewards, cfg, registry), cfg, registry)
    assert a[0, 0] > 0 > a[0, 1]


def test_config_defaults_and_rules_come_from_the_algorithm_metadata(registry) -> None:  # type: ignore[no-untyped-def]
    assert _load(registry, algorithm="reinforce_pp").advantage_norm == "batch"
    with pytest.raises(ConfigError, match="use_ppo_clip: true is invalid with algorithm 'sapo'"):
        _load(registry, algorithm="sapo", use_ppo_clip=True)
    with pytest.raises(ConfigError, match="advantage_norm: 'batch' is invalid with algorithm 'rloo'"):
        _load(registry, algorithm="rloo", advantage_norm="batch")
    assert _load(registry, algorithm="grpo", use_ppo_clip=True).use_ppo_clip


def test_unknown_algorithm_is_a_config_error_listing_the_registered_ones(registry) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        _load(registry, algorithm="grpoo")
    message = str(err.value)
    assert "algorithm" in message and "'grpoo'" in message and "Did you mean 'grpo'?" in message
    for name in (*ALGORITHMS, "median_baseline"):
        assert name in message
    with pytest.raises(UnknownComponentError, match="Registered: cispo, dr_grpo, grpo"):
        get_algorithm("grpoo", registry)


def test_plugin_algorithm_end_to_end(registry) -> None:  # type: ignore[no-untyped-def]
    cfg = _load(registry, algorithm="median_baseline", use_tis=True, tis_cap=1.5, tis_logprob_clamp=20.0)
    with pytest.raises(ConfigError, match="use_ppo_clip: true is invalid with algorithm 'median_baseline'"):
        _load(registry, algorithm="median_baseline", use_ppo_clip=True)

    rewards = torch.tensor([[0.0, 1.0, 5.0], [2.0, 2.0, 3.0]])
    advantages = compute_advantages(rewards, cfg, registry)
    assert advantages.tolist() == [[-1.0, 0.0, 4.0], [0.0, 0.0, 1.0]]

    logprobs = torch.tensor([-1.0, -0.5, -2.0, -0.1], requires_grad=True)
    inference = torch.tensor([-1.0, -1.0, -2.0, -0.1])  # token 1: exp(0.5) = 1.65 > cap 1.5
    inputs = LossInputs(
        logprobs=logprobs,
        inference_logprobs=inference,
        advantages=torch.tensor([4.0, 4.0, 1.0, 1.0]),
        loss_mask=torch.tensor([0.0, 1.0, 1.0, 1.0]),
        position_ids=torch.tensor([0, 1, 0, 1]),
        num_loss_tokens=6,
        num_samples=3,
    )
    out = policy_loss(inputs, cfg, registry)
    # Σ m_t · (−2 ℓ_t A_t) · w_t / 6 with w = (1.5, 1, 1) on the three loss tokens.
    expected = (-2 * -0.5 * 4 * 1.5 - 2 * -2.0 * 1 - 2 * -0.1 * 1) / 6
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-6)
    out.loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([0.0, -2 * 4 * 1.5 / 6, -2 / 6, -2 / 6])
    # The default (installed) registry does not know the in-test plugin.
    with pytest.raises(UnknownComponentError):
        get_algorithm("median_baseline")


def test_factory_must_build_an_algorithm(registry) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="'not_an_algorithm' factory returned dict"):
        get_algorithm("not_an_algorithm", registry)


def test_bad_loss_inputs_are_named(registry) -> None:  # type: ignore[no-untyped-def]
    def inputs(n: int = 3, **over: Any) -> LossInputs:
        fields = {k: torch.zeros(n) for k in ("logprobs", "inference_logprobs", "advantages", "loss_mask")}
        fields.update(position_ids=torch.arange(n), num_loss_tokens=n, num_samples=1)
        fields.update(over)
        return LossInputs(**fields)

    with pytest.raises(ValueError, match="old_logprobs is None"):
        policy_loss(inputs(), _load(registry, algorithm="cispo", ppo_clip_ref_logprobs="batch"), registry)
    with pytest.raises(ValueError, match=r"LossInputs.advantages has shape \(2,\)"):
        policy_loss(inputs(advantages=torch.zeros(2)), _load(registry, algorithm="grpo"), registry)
    # The plain REINFORCE loss needs no reference, so batch mode without old_logprobs is fine.
    out = policy_loss(inputs(), _load(registry, algorithm="grpo", ppo_clip_ref_logprobs="batch"), registry)
    assert float(out.loss) == 0.0


def test_importing_the_package_and_registering_does_not_import_torch() -> None:
    code = (
        "import sys, telescope.core.algorithms as a; from telescope.core.testing import registry_with; "
        "r = registry_with()[1]; assert len(r.names('algorithm')) == 7; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
