"""Validation against installed plugins, using an in-test plugin set (independent of built-ins)."""

from __future__ import annotations

import pytest

from telescope.core import hookimpl
from telescope.core.config import ConfigError, load_config, load_config_with_sources
from telescope.core.env import EnvironmentKwargs
from telescope.core.testing import registry_with


class ToyKwargs(EnvironmentKwargs):
    difficulty: int = 1
    """How hard."""


class ToyPlugin:
    @hookimpl
    def telescope_register_algorithms(self, register):  # type: ignore[no-untyped-def]
        register.add("plain", "x:y")
        register.add("ratio", "x:y", supports_ppo_clip=False)
        register.add("grouponly", "x:y", advantage_norms=("group",))
        register.add("batchy", "x:y", advantage_norms=("batch",), default_advantage_norm="batch")

    @hookimpl
    def telescope_register_trainer_backends(self, register):  # type: ignore[no-untyped-def]
        register.add("fsdp", "x:y", supports_lora=True)
        register.add("megatron", "x:y")
        register.add("slow", "x:y", unavailable="needs the 'slowlib' package: pip install slowlib")

    @hookimpl
    def telescope_register_environments(self, register):  # type: ignore[no-untyped-def]
        register.add("toy", dict, kwargs_model=ToyKwargs)  # callable: nothing to import
        register.add("bare", "x:y")

    @hookimpl
    def telescope_register_evals(self, register):  # type: ignore[no-untyped-def]
        register.add("bench500", "x:y")


@pytest.fixture
def registry():  # type: ignore[no-untyped-def]
    return registry_with(("toy", ToyPlugin()), builtins=False)[1]


def cfg(registry, **fields):  # type: ignore[no-untyped-def]
    fields.setdefault("environments", [{"name": "toy"}])
    fields.setdefault("algorithm", "plain")
    return load_config(None, fields, registry)


def problems(registry, **fields) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        cfg(registry, **fields)
    return str(err.value)


def test_valid(registry) -> None:  # type: ignore[no-untyped-def]
    c = cfg(registry, evals=[{"name": "bench500"}, {"name": "toy", "kwargs": {"difficulty": 3}}])
    assert c.algorithm == "plain"


def test_unknown_names_list_valid_ones(registry) -> None:  # type: ignore[no-untyped-def]
    text = problems(registry, algorithm="plian")
    assert "algorithm" in text and "'plian'" in text and "Did you mean 'plain'" in text
    assert "batchy, grouponly, plain, ratio" in text
    assert "environments[0].name" in problems(registry, environments=[{"name": "toyy"}])
    assert "evals[0].name" in problems(registry, evals=[{"name": "nope"}])
    assert "train_backend" in problems(registry, train_backend="fdsp")


def test_unavailable_component(registry) -> None:  # type: ignore[no-untyped-def]
    text = problems(registry, train_backend="slow")
    assert "train_backend" in text and "pip install slowlib" in text


def test_env_kwargs_validated_by_env_model(registry) -> None:  # type: ignore[no-untyped-def]
    text = problems(registry, environments=[{"name": "toy", "kwargs": {"dificulty": 2}}])
    assert "environments[0].kwargs.dificulty" in text
    text = problems(registry, environments=[{"name": "toy", "kwargs": {"difficulty": "hard"}}])
    assert "environments[0].kwargs.difficulty" in text
    assert "takes no kwargs" in problems(registry, environments=[{"name": "bare", "kwargs": {"a": 1}}])


def test_algorithm_rules_come_from_registration_meta(registry) -> None:  # type: ignore[no-untyped-def]
    assert "use_ppo_clip" in problems(registry, algorithm="ratio", use_ppo_clip=True)
    assert cfg(registry, algorithm="plain", use_ppo_clip=True).use_ppo_clip
    assert "advantage_norm" in problems(registry, algorithm="grouponly", advantage_norm="batch")


def test_default_advantage_norm_chosen_unless_user_set(registry) -> None:  # type: ignore[no-untyped-def]
    c, layers = load_config_with_sources(
        None, {"environments": [{"name": "toy"}], "algorithm": "batchy"}, registry
    )
    assert c.advantage_norm == "batch"
    assert layers.sources["advantage_norm"] == "algorithm batchy"
    text = problems(registry, algorithm="batchy", advantage_norm="group")
    assert "advantage_norm" in text and "batch" in text


def test_lora_needs_a_backend_that_supports_it(registry) -> None:  # type: ignore[no-untyped-def]
    assert cfg(registry, lora_rank=4).lora_rank == 4
    text = problems(registry, lora_rank=4, train_backend="megatron")
    assert "lora_rank: 4" in text and "'megatron'" in text and "lora_rank: 0" in text and "fsdp" in text
    assert cfg(registry, lora_rank=0, train_backend="megatron").train_backend == "megatron"


def test_lora_field_ranges(registry) -> None:  # type: ignore[no-untyped-def]
    assert "lora_rank" in problems(registry, lora_rank=-1)
    assert "lora_dropout" in problems(registry, lora_dropout=1.0)
    assert "lora_alpha" in problems(registry, lora_alpha=0)
    assert "lora_target_modules" in problems(registry, lora_target_modules=[])
    assert cfg(registry, lora_rank=2, lora_target_modules=["q_proj"]).lora_target_modules == ["q_proj"]
