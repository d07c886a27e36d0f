"""environment_info: the reward and sample-metric ranges recorded for charts (run.json info)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from telescope.core.observe import LoggerHub, RunDirReader, environment_info
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.testing import make_config


class MathLike:
    """Class-level ranges, single turn, bounds from the environment class."""

    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {"correct": {"min": 0.0, "max": 1.0}}
    is_multi_turn = False
    reward_min, reward_max = 0.0, 1.0

    def samples(self) -> list[int]:
        return [1, 2, 3]


class GameLike:
    """Ranges from a property (as rubric environments have), multi-turn, no bounds of its own."""

    is_multi_turn = True
    reward_min = reward_max = None

    @property
    def metrics_ranges(self) -> dict[str, dict[str, Any]]:
        return {"turns": {"min": 1, "max": 6}}

    def samples(self) -> list[int]:
        return list(range(10))


def test_environment_info_from_config_entries_and_environments(tmp_path: Path) -> None:
    cfg = make_config(
        use_wandb=False,
        environments=[
            {"name": "math", "weight": 2.0},
            {"name": "game", "weight": 0.5, "reward_min": -1.0, "reward_max": 3.0},
        ],
    )
    info = environment_info({"math": MathLike(), "game": GameLike()}, cfg)
    assert info == [
        {
            "name": "math",
            "weight": 2.0,
            "reward_min": 0.0,
            "reward_max": 1.0,
            "metrics_ranges": {"correct": {"min": 0.0, "max": 1.0}},
            "tags_options": {},
            "dataset_size": 3,
            "multi_turn": False,
        },
        {
            "name": "game",
            "weight": 0.5,
            "reward_min": -1.0,
            "reward_max": 3.0,
            "metrics_ranges": {"turns": {"min": 1, "max": 6}},
            "tags_options": {},
            "dataset_size": 10,
            "multi_turn": True,
        },
    ]
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, tmp_path, system_metrics=False, ticker=False)
    hub.log_info({"environments": info})
    hub.finish("finished")
    assert RunDirReader(tmp_path).meta["info"]["environments"] == info  # recorded for charts


def test_environment_info_without_a_config() -> None:
    (entry,) = environment_info({"game": GameLike()})
    assert entry["weight"] == 1.0 and entry["reward_min"] is None and entry["reward_max"] is None
