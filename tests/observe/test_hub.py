"""LoggerHub fan-out: failures are counted and warned once; plugin-built hubs honour the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from telescope.core import hookimpl
from telescope.core.observe import (
    Logger,
    LoggerHub,
    LoggerStartError,
    RolloutRecord,
    build_logger_hub,
    enabled_logger_names,
)
from telescope.core.observe.loggers.console import ConsoleLogger
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.registry import Register
from telescope.core.testing import make_config, registry_with


class Recorder(Logger):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.warnings: list[str] = []

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.calls.append(("step", (step, metrics)))

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        self.calls.append(("rollouts", rows))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def finish(self, status: str) -> None:
        self.calls.append(("finish", status))


class Broken(Logger):
    name = "broken"

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        raise OSError("disk full")


def test_failing_logger_is_counted_and_warned_once(tmp_path: Path) -> None:
    rec, cfg = Recorder(), make_config(use_wandb=False)
    hub = LoggerHub([Broken(), rec])
    hub.start(cfg, tmp_path, system_metrics=False)
    for step in range(3):
        hub.log_step(step, {"loss": float(step)})
    assert hub.failures[("broken", "log_step")] == 3
    assert len(rec.warnings) == 1 and "broken" in rec.warnings[0] and "disk full" in rec.warnings[0]
    assert [c[1][0] for c in rec.calls if c[0] == "step"] == [0, 1, 2]  # others still got every call
    hub.finish("finished")
    hub.finish("finished")  # idempotent
    assert rec.calls[-1] == ("finish", "finished") and sum(c[0] == "finish" for c in rec.calls) == 1


def test_rollout_dicts_are_validated(tmp_path: Path) -> None:
    rec = Recorder()
    hub = LoggerHub([rec])
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False)
    hub.log_rollouts(1, [{"step": 1, "group_id": 0, "env": "e", "sample_id": 0, "reward": 1.0}])
    assert rec.calls[0][1][0].reward == 1.0
    with pytest.raises(ValueError, match="unknown fields \\['rewrd'\\]"):
        hub.log_rollouts(1, [{"step": 1, "group_id": 0, "env": "e", "sample_id": 0, "rewrd": 1.0}])
    with pytest.raises(ValueError, match="finish status 'ok'"):
        hub.finish("ok")


def test_required_logger_start_failure_stops_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    hub = LoggerHub([LocalLogger()])
    with pytest.raises(LoggerStartError, match="'local' could not start"):
        hub.start(make_config(use_wandb=False), blocker / "run", system_metrics=False)


class Extra(Logger):
    name = "extra"

    def __init__(self) -> None:
        pass


class _ExtraPlugin:
    @hookimpl
    def telescope_register_loggers(self, register: Register) -> None:
        register.add("extra", Extra, description="third-party observer")
        register.add("needs_missing", Extra, unavailable="missing dep: pip install x", enabled_by="use_wandb")


def test_build_from_registry_honours_config(tmp_path: Path) -> None:
    _, registry = registry_with(("extra", _ExtraPlugin()))
    hub = build_logger_hub(make_config(use_wandb=False), registry)
    assert [lg.name for lg in hub.loggers] == ["local", "console", "extra"]
    assert isinstance(hub.loggers[0], LocalLogger) and isinstance(hub.loggers[1], ConsoleLogger)
    assert enabled_logger_names(make_config(use_wandb=True), registry) == [
        "local",
        "console",
        "extra",
        "needs_missing",
        "wandb",
    ]
    hub = build_logger_hub(make_config(use_wandb=True), registry, exclude=("console", "wandb"))
    names = [lg.name for lg in hub.loggers]
    assert "needs_missing" not in names and hub.skipped["needs_missing"].startswith("missing dep")
    rec = Recorder()
    hub.loggers.append(rec)
    hub.start(make_config(use_wandb=True), tmp_path, system_metrics=False)
    assert any("needs_missing" in w and "pip install x" in w for w in rec.warnings)
    hub.finish("finished")


class EveryCall(Logger):
    """Keeps every logger call, in order."""

    name = "every"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.calls.append(("log_step", step, metrics))

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        self.calls.append(("log_rollouts", step, [(r.group_id, r.sample_id) for r in rows]))

    def log_events(self, events: list[Any]) -> None:
        self.calls.append(("log_events", [(e.type, e.phase, e.step) for e in events]))

    def log_system(self, sample: dict[str, Any]) -> None:
        self.calls.append(("log_system", sample["source"]))

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self.calls.append(("log_eval", step, name, metrics, len(rows)))

    def log_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("log_info", info))

    def warn(self, message: str) -> None:
        self.calls.append(("warn", message))

    def finish(self, status: str) -> None:
        self.calls.append(("finish", status))


def test_the_hub_as_a_plugin_hands_every_run_hook_to_its_loggers(tmp_path: Path) -> None:
    from telescope.core.observe import TimelineEvent
    from telescope.core.testing import recording_hooks

    every = EveryCall()
    hub = LoggerHub([every])
    hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False, ticker=False)
    hook, recorder = recording_hooks(hub)  # a run's plugin manager: the hub beside another plugin
    hub.report_system = lambda sample: hook.telescope_system_sample(sample=sample)
    rows = [RolloutRecord(step=2, group_id=7, env="e", sample_id=i) for i in range(2)]
    hook.telescope_run_info(info={"setup": {"engine": "transformers"}})
    hook.telescope_events(events=[TimelineEvent("trainer", "start", step=2)])
    hook.telescope_group_end(group=object(), step=2)  # the hub keeps no per-group state: not a logger call
    hook.telescope_step_end(step=2, metrics={"loss": 0.5}, rollouts=rows)
    hook.telescope_eval_end(step=2, name="math", metrics={"pass@1": 0.25}, rows=[{"prompt": "q"}])
    hub._system_sample({"source": "system", "metrics": {}})  # what the sampler thread calls
    hook.telescope_warning(message="checkpoint at step 2 failed")
    hook.telescope_run_end(status="interrupted", error=None)
    assert every.calls == [
        ("log_info", {"setup": {"engine": "transformers"}}),
        ("log_events", [("trainer", "start", 2)]),
        ("log_rollouts", 2, [(7, 0), (7, 1)]),
        ("log_step", 2, {"loss": 0.5}),
        ("log_eval", 2, "math", {"pass@1": 0.25}, 1),
        ("log_system", "system"),
        ("warn", "checkpoint at step 2 failed"),
        ("finish", "interrupted"),
    ]
    assert len(recorder.system) == 1 and recorder.ends == ["interrupted"]  # the other plugin saw them too
