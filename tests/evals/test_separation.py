"""separate_eval_samples: for every registered environment, eval samples never reach training."""

from __future__ import annotations

from typing import Any

import pytest

from telescope.core.env.resolve import create_environment
from telescope.core.evals import sample_key, training_exclusions
from telescope.core.plugins import load_plugins
from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv
from telescope.core.testing import make_config

_, REGISTRY = load_plugins()


def offline_kwargs(name: str) -> dict[str, Any]:
    """Kwargs that load without the hub: the shipped sample file where the environment has one."""
    component = REGISTRY.get("environment", name)
    model = component.kwargs_model
    kwargs = {"sample_data": True} if model is not None and "sample_data" in model.model_fields else {}
    return {**kwargs, **component.meta.get("example_kwargs", {})}


def trained_keys(
    name: str, kwargs: dict[str, Any], excluded: frozenset[int], epochs: float
) -> tuple[set[str], set[int]]:
    env = create_environment(REGISTRY, name, kwargs)
    scheduler = PromptScheduler([SourceEnv(name, 1.0, len(env), excluded)], seed=11)
    draws = int((len(env) - len(excluded)) * epochs) + 1
    items = [scheduler.next() for _ in range(draws)]
    assert max(i.epoch for i in items) >= 1  # more than one epoch
    return {sample_key(env.get_sample(i.sample_idx)) for i in items}, {i.sample_idx for i in items}


@pytest.mark.parametrize("name", REGISTRY.names("environment", available_only=True))
def test_eval_samples_never_reach_training(name: str) -> None:
    kwargs = offline_kwargs(name)
    size = len(create_environment(REGISTRY, name, kwargs).samples())
    num = max(1, min(5, size // 3))
    cfg = make_config(
        environments=[{"name": name, "kwargs": kwargs}],
        evals=[{"name": name, "kwargs": kwargs, "num_samples": num, "separate_eval_samples": True}],
    )
    excluded = training_exclusions(cfg, REGISTRY)[name]
    held_out = {sample_key(s) for s in create_environment(REGISTRY, name, kwargs).samples()[:num]}
    assert len(held_out) >= 1 and len(excluded) >= len(held_out)
    trained, indices = trained_keys(name, kwargs, excluded, epochs=2.0)
    assert not trained & held_out
    assert indices == set(range(size)) - excluded  # everything else is still trained on


def test_content_not_indices_when_eval_kwargs_differ() -> None:
    train_kw = {"sample_data": True}
    eval_kw = {"sample_data": True, "shuffle": True, "seed": 5}
    cfg = make_config(
        environments=[{"name": "countdown", "kwargs": train_kw}],
        evals=[{"name": "countdown", "kwargs": eval_kw, "num_samples": 6, "separate_eval_samples": True}],
    )
    excluded = training_exclusions(cfg, REGISTRY)["countdown"]
    held_out = {sample_key(s) for s in create_environment(REGISTRY, "countdown", eval_kw).samples()[:6]}
    assert excluded != frozenset(range(6))  # the shuffled eval holds other indices of the training order
    trained, _ = trained_keys("countdown", train_kw, excluded, epochs=1.5)
    assert not trained & held_out


def test_nothing_reserved_without_the_flag_or_for_a_dedicated_eval() -> None:
    cfg = make_config(
        environments=[{"name": "reverse_text"}],
        evals=[
            {"name": "reverse_text", "num_samples": 4},
            {
                "name": "math500",
                "num_samples": 4,
                "separate_eval_samples": True,
                "kwargs": {"sample_data": True},
            },
        ],
    )
    assert training_exclusions(cfg, REGISTRY) == {}
