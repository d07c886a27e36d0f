"""Seeded prompt scheduling across weighted environments.

Each environment is read in epochs: a seeded permutation of its usable indices, so every
sample is seen once per epoch (no sampling with replacement, no lost coverage). Which
environment supplies the next prompt is a seeded weighted draw. The whole state is a small
dict, so a checkpoint can store it and a resume continues exactly where the run stopped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptItem", "PromptScheduler", "SourceEnv"]


@dataclass(frozen=True)
class SourceEnv:
    """One training environment as the scheduler sees it."""

    name: str
    weight: float
    num_samples: int
    excluded: frozenset[int] = frozenset()


@dataclass(frozen=True)
class PromptItem:
    """One scheduled prompt: which environment, which dataset index, and a unique group id."""

    group_id: int
    env_name: str
    sample_idx: int
    epoch: int


class _EnvCursor:
    """Epoch-wise seeded permutation over one environment's usable indices."""

    def __init__(self, source: SourceEnv, seed: int) -> None:
        self.usable = [i for i in range(source.num_samples) if i not in source.excluded]
        if not self.usable:
            raise ValueError(
                f"environment '{source.name}' has no training samples left "
                f"({source.num_samples} samples, {len(source.excluded)} reserved for evals); "
                "lower the eval's num_samples or add data"
            )
        self.seed = f"{seed}:{source.name}"
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(self.usable)
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next(self) -> tuple[int, int]:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        idx = self._order[self.position]
        self.position += 1
        return idx, self.epoch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)


class PromptScheduler:
    """Picks environments by weight and prompts by per-environment seeded epochs."""

    def __init__(self, sources: list[SourceEnv], seed: int) -> None:
        if not sources:
            raise ValueError("at least one environment is required")
        self.sources = list(sources)
        self._names = [s.name for s in sources]
        self._weights = [s.weight for s in sources]
        self._cursors = {s.name: _EnvCursor(s, seed) for s in sources}
        self._env_rng = random.Random(f"{seed}:environments")
        self._next_group_id = 0

    def next(self) -> PromptItem:
        """The next prompt to dispatch."""
        name = (
            self._names[0] if len(self._names) == 1 else self._env_rng.choices(self._names, self._weights)[0]
        )
        idx, epoch = self._cursors[name].next()
        item = PromptItem(self._next_group_id, name, idx, epoch)
        self._next_group_id += 1
        return item

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same sequence."""
        return {
            "next_group_id": self._next_group_id,
            "env_rng": _rng_state_to_list(self._env_rng.getstate()),
            "cursors": {name: c.state() for name, c in self._cursors.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()`` output."""
        self._next_group_id = int(state["next_group_id"])
        self._env_rng.setstate(_rng_state_from_list(state["env_rng"]))
        for name, cursor_state in state["cursors"].items():
            if name in self._cursors:
                self._cursors[name].restore(cursor_state)


def _rng_state_to_list(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_list(data: list[Any]) -> tuple[Any, ...]:
    return (data[0], tuple(data[1]), data[2])
