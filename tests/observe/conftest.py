"""Shared fixtures: a config, synthetic rollouts, and a run directory written by our own loggers."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard

from telescope.core.observe import LoggerHub, RolloutRecord, rollout_metrics
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.testing import discarded_rows, kept_group_rows, make_config


def synthetic_rows(step: int) -> list[RolloutRecord]:
    """Two kept groups, one max_async group, one zero-advantage group, one cancelled rollout."""
    rows = []
    rewards = {0: [1.0, 0.0, 0.0, float(step % 2)], 1: [0.5, 0.0, 0.25, 1.0]}
    for gid, rs in rewards.items():
        rows += kept_group_rows(
            step,
            gid,
            rs,
            lambda i, r, gid=gid: {
                "prompt_text": f"reverse: word{gid}",
                "completion_text": f"<{gid}:{i}> drow",
                "completion_ids": list(range(5 + i)),
                "sample_metrics": {"correct": float(r > 0)},
            },
        )
    max_async = discarded_rows(step, 2, "max_async", 2, prompt_ids=[1], completion_ids=[7] * 3, reward=1.0)
    zero_advantage = discarded_rows(
        step,
        3,
        "zero_advantage",
        2,
        prompt_ids=[1],
        completion_ids=[7],
        reward=0.0,
        zero_advantage_kind="all_zero",
    )
    for pair in zip(max_async, zero_advantage, strict=True):
        rows += pair
    rows += discarded_rows(step, 4, "off_policy")
    return rows


def write_synthetic_run(run_dir: Path, cfg: Any, steps: int = 4) -> LoggerHub:
    """A finished run written through a hub with only the local logger."""
    hub = LoggerHub([LocalLogger()])
    hub.start(cfg, run_dir, system_metrics=False)
    hub.log_info({"environments": [{"name": "reverse_text", "reward_min": 0.0, "reward_max": 1.0}]})
    for step in range(1, steps + 1):
        rows = synthetic_rows(step)
        with hub.span("trainer", name="train_step", step=step):
            pass
        hub.event("generation", "start", step=step, group_id=0, sample_id=0, server=0, lane=0)
        hub.event("generation", "end", step=step, group_id=0, sample_id=0, server=0, lane=0)
        hub.log_rollouts(step, rows)
        metrics = rollout_metrics(rows)
        metrics.update({"entropy": 1.0 / step, "grad_norm": 0.5, "timing_step_total": 2.0})
        hub.log_step(step, metrics)
    hub.finish("finished")
    return hub


class FakeClock:
    """A clock tests move by hand: ``clock()`` reads it, ``clock.advance(s)``/``clock.at(t)`` move it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> FakeClock:
        self.now += seconds
        return self

    def at(self, t: float) -> FakeClock:
        self.now = float(t)
        return self


class FakeTable:
    def __init__(self, columns: list[str], data: list[list[Any]]) -> None:
        self.columns, self.data = list(columns), [list(r) for r in data]


class FakeRun:
    """Records what the W&B logger asks of a run: history entries, file saves, summary, code."""

    def __init__(self, **init_kwargs: Any) -> None:
        self.init_kwargs = init_kwargs
        self.id, self.project = "fake123", init_kwargs.get("project")
        self.logged: list[tuple[dict[str, Any], int]] = []
        self.saved: list[tuple[str, str, str]] = []
        self.summary: dict[str, Any] = {}
        self.finished: int | None = None

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append((dict(data), step))

    def save(self, path: str, base_path: str, policy: str) -> None:
        """Records the file's text as uploaded (a compressed record file decompressed by zstandard itself)."""
        data = Path(path).read_bytes()
        if path.endswith(".zst"):
            data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
        self.saved.append((str(Path(path).relative_to(base_path)), data.decode("utf-8"), policy))

    def log_code(self, **kwargs: Any) -> None:
        raise AssertionError("code upload is off in these tests")

    def finish(self, exit_code: int) -> None:
        self.finished = exit_code


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``wandb`` module stand-in in sys.modules; ``.runs`` lists the runs ``init`` made."""
    runs: list[FakeRun] = []

    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.Table = FakeTable  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return types.SimpleNamespace(module=module, runs=runs)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cfg() -> Any:
    return make_config(number_of_steps=4, wandb_run_name="synthetic", use_wandb=False)


@pytest.fixture
def synthetic_run(tmp_path: Path, cfg: Any) -> Path:
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, cfg)
    return run_dir


@pytest.fixture
def make_rows():
    return synthetic_rows


@pytest.fixture
def otlp_json() -> Callable[..., dict[str, Any]]:
    """``otlp_json((key, value_type, value), ...)``: an OTLP/JSON export of one ``llm_request`` span
    with those attributes (value_type: ``stringValue``, ``doubleValue``, ``intValue``)."""

    def build(*attributes: tuple[str, str, Any]) -> dict[str, Any]:
        span = {"name": "llm_request", "attributes": [{"key": k, "value": {t: v}} for k, t, v in attributes]}
        return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}

    return build
