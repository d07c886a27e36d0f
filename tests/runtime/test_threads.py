"""The torch thread rule: overrides, sync mode shares the node, async mode rounds placed CPUs up."""

from __future__ import annotations

import pytest

from telescope.core.cluster.threads import choose_torch_threads
from telescope.core.testing import make_config


def cfg(**overrides: object) -> object:
    base: dict[str, object] = {"ray_trainer_cpus_per_worker": 0.5, "ray_inference_cpus_per_worker": 0.5}
    return make_config(**{**base, **overrides})


@pytest.mark.parametrize(
    ("overrides", "cpus", "trainer", "inference"),
    [
        # sync: 8 cores shared by 2 trainer ranks (4 each) and by 1 server (all 8)
        ({"max_async_rollout": 0, "trainer_num_workers": 2, "inference_num_workers": 1}, 8, 4, 8),
        # sync on 2 cores with 1 rank and 1 server: both sides get both cores
        ({"max_async_rollout": 0, "trainer_num_workers": 1, "inference_num_workers": 1}, 2, 2, 2),
        # sync with more ranks than cores: never zero threads
        ({"max_async_rollout": 0, "trainer_num_workers": 4, "inference_num_workers": 1}, 2, 1, 2),
        # async: placed cpus rounded up (0.5 -> 1), never zero
        ({"max_async_rollout": 1}, 8, 1, 1),
        # async: 1.5 -> 2 and 3 -> 3, capped at the node's cores
        (
            {
                "max_async_rollout": 2,
                "ray_trainer_cpus_per_worker": 1.5,
                "ray_inference_cpus_per_worker": 3.0,
            },
            2,
            2,
            2,
        ),
        (
            {
                "max_async_rollout": 2,
                "ray_trainer_cpus_per_worker": 1.5,
                "ray_inference_cpus_per_worker": 3.0,
            },
            8,
            2,
            3,
        ),
        # explicit overrides win in either mode
        ({"max_async_rollout": 0, "trainer_torch_threads": 3, "inference_torch_threads": 5}, 2, 3, 5),
    ],
)
def test_thread_rule(overrides: dict[str, object], cpus: int, trainer: int, inference: int) -> None:
    c = cfg(**overrides)
    assert choose_torch_threads(c, "trainer", cpus).threads == trainer
    assert choose_torch_threads(c, "inference", cpus).threads == inference


def test_rule_names_its_source() -> None:
    assert choose_torch_threads(cfg(trainer_torch_threads=3), "trainer", 2).rule == "trainer_torch_threads"
    assert choose_torch_threads(cfg(max_async_rollout=0), "trainer", 2).rule.startswith("sync: 2 node cores")
    assert "rounded up" in choose_torch_threads(cfg(max_async_rollout=1), "inference", 2).rule


def test_engine_num_threads_wins_for_transformers_servers() -> None:
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import server_threads

    c = cfg(max_async_rollout=0, inference_torch_threads=5)
    assert server_threads(c, TransformersEngineKwargs(num_threads=2)).threads == 2
    assert server_threads(c, TransformersEngineKwargs()).threads == 5


def test_bad_override_is_rejected() -> None:
    with pytest.raises(ValueError, match="trainer_torch_threads"):
        cfg(trainer_torch_threads=0)
