"""Reward ranges: the config's null means the environment's declared range; metrics log the raw
reward under ``reward/*`` and the normalised one (what training uses) under ``reward_normalized/*``."""

from __future__ import annotations

from typing import Any

import pytest

from telescope.core.observe import rollout_metrics
from telescope.core.observe.rundir.records import RolloutRecord
from telescope.core.runtime.assemble import load_environments
from telescope.core.testing import make_config


def test_null_range_keeps_the_environment_declared_one(registry: Any) -> None:
    cfg = make_config(
        environments=[
            {"name": "countdown", "kwargs": {"num_generated": 2}},
            {"name": "reverse_text", "reward_max": 4.0, "kwargs": {"num_generated": 2}},
        ]
    )
    envs = load_environments(cfg, registry)
    assert (envs["countdown"].reward_min, envs["countdown"].reward_max) == (0.0, 2.0)  # the class's
    assert (envs["reverse_text"].reward_min, envs["reverse_text"].reward_max) == (0.0, 4.0)


def _row(group: int, raw: float, lo: float, hi: float, env: str = "countdown") -> RolloutRecord:
    return RolloutRecord(
        step=1, group_id=group, env=env, sample_id=0, reward=(raw - lo) / (hi - lo), raw_reward=raw
    )


def test_metrics_log_raw_and_normalised_rewards_apart() -> None:
    rows = [_row(0, 2.0, 0, 2), _row(0, 1.0, 0, 2), _row(1, 0.0, 0, 2), _row(1, 2.0, 0, 2)]
    m = rollout_metrics(rows)
    assert m["reward/mean"] == pytest.approx(5.0 / 4) and m["reward/max"] == 2.0
    assert m["reward_normalized/mean"] == pytest.approx(5.0 / 8) and m["reward_normalized/max"] == 1.0
    unit = rollout_metrics([_row(0, 1.0, 0, 1), _row(0, 0.0, 0, 1)])  # nothing normalised away
    assert unit["reward/mean"] == 0.5 and not any(k.startswith("reward_normalized") for k in unit)
    mixed = rollout_metrics([*rows, _row(2, 0.5, 0, 1, "math"), _row(2, 1.0, 0, 1, "math")])
    assert mixed["reward/countdown/mean"] == pytest.approx(5.0 / 4)
    assert mixed["reward_normalized/countdown/mean"] == pytest.approx(5.0 / 8)
    assert mixed["reward_normalized/math/mean"] == mixed["reward/math/mean"] == 0.75


def test_evals_record_their_declared_ranges(registry: Any, tmp_path: Any) -> None:
    from telescope.core.env import create_eval
    from telescope.core.observe import LoggerHub, RunDirReader, eval_info
    from telescope.core.observe.loggers.local import LocalLogger

    math500 = create_eval(registry, "math500", {"sample_data": True})
    (entry,) = eval_info({"math500": math500})
    assert entry["metrics_ranges"] == {
        "correct": {"min": 0.0, "max": 1.0, "invert": False},
        "level": {"min": 1.0, "max": 5.0, "invert": False},
    }
    assert (entry["reward_min"], entry["reward_max"], entry["multi_turn"]) == (0.0, 1.0, False)
    assert entry["dataset_size"] == len(math500.samples()) and entry["tags_options"] == {}
    hub = LoggerHub([LocalLogger()])
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    hub.log_info({"evals": [entry]})
    hub.finish("finished")
    assert RunDirReader(tmp_path).meta["info"]["evals"] == [entry]
