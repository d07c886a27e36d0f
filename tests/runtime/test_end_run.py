"""The end of a run stops every worker and closes the run even when a plugin raises on the way, and a
plugin's error never takes the place of the run's own."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from telescope.core import hookimpl
from telescope.core.errors import RunStageError
from telescope.core.runtime import driver
from telescope.core.runtime.driver import _end_run
from telescope.core.testing import make_config, recording_plugin_manager, registry_with


@dataclass
class FakeSession:
    """Stands in for the run's Ray session (its actors and servers)."""

    stopped: int = 0

    def stop(self) -> None:
        self.stopped += 1


@dataclass
class FakeHub:
    """Stands in for the logger hub: records what the end of the run asked of it."""

    calls: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    def log_info(self, info: dict[str, Any]) -> None:
        self.infos.append(info)

    def stop_sources(self) -> None:
        self.calls.append("stop_sources")

    def finish(self, status: str) -> None:
        self.calls.append(f"finish {status}")


class FailsOnRunInfo:
    @hookimpl
    def telescope_run_info(self, info: dict[str, Any]) -> None:
        raise RuntimeError("plugin bug in run_info")


class FailsOnRunEnd:
    @hookimpl
    def telescope_run_end(self, status: str) -> None:
        raise RuntimeError("plugin bug in run_end")


def test_a_plugin_raising_while_the_failure_is_recorded_still_stops_the_workers(tmp_path: Path) -> None:
    pm, recorder = recording_plugin_manager(FailsOnRunInfo())
    session, hub = FakeSession(), FakeHub()
    ending = _end_run(pm, hub, session, "failed", RuntimeError("trainer died"), tmp_path)  # type: ignore[arg-type]
    assert ending is None  # the caller raises the run's own error
    assert session.stopped == 1
    assert hub.calls == ["stop_sources", "finish failed"]
    assert (
        recorder.infos[0]["failure"]["reason"] == "RuntimeError: trainer died"
    )  # the others still record it
    assert recorder.ends == ["failed"]  # and hear how the run ended
    (failure,) = hub.infos[0]["hook_failures"]
    assert (
        failure["hook"] == "telescope_run_info" and failure["error"] == "RuntimeError: plugin bug in run_info"
    )


def test_a_plugin_raising_at_the_end_of_a_failed_run_is_reported_and_the_run_keeps_its_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = FailsOnRunEnd()
    pm, recorder = recording_plugin_manager(plugin)
    session, hub = FakeSession(), FakeHub()
    ending = _end_run(pm, hub, session, "failed", RuntimeError("trainer died"), tmp_path)  # type: ignore[arg-type]
    assert ending is None
    assert session.stopped == 1 and hub.calls == ["stop_sources", "finish failed"]
    assert recorder.ends == ["failed"]  # called on its own: the failing plugin does not hide it
    (failure,) = hub.infos[-1]["hook_failures"]
    assert failure["hook"] == "telescope_run_end" and failure["plugin"] == str(id(plugin))  # pluggy's name
    assert "RuntimeError: plugin bug in run_end" in failure["error"]
    assert (
        f"the telescope_run_end hook of plugin '{id(plugin)}' failed: RuntimeError: plugin bug in run_end"
        in (caplog.text)
    )


def test_a_plugin_raising_at_the_end_of_a_run_that_succeeded_fails_the_run_naming_the_hook(
    tmp_path: Path,
) -> None:
    plugin = FailsOnRunEnd()
    pm, recorder = recording_plugin_manager(plugin)
    session, hub = FakeSession(), FakeHub()
    ending = _end_run(pm, hub, session, "completed", None, tmp_path)  # type: ignore[arg-type]
    assert isinstance(ending, RunStageError)
    assert str(ending).startswith(f"the telescope_run_end hook of plugin '{id(plugin)}'")
    assert str(ending).endswith("failed: RuntimeError: plugin bug in run_end")
    assert session.stopped == 1 and hub.calls == ["stop_sources", "finish failed"]
    assert recorder.ends == ["completed"]
    assert hub.infos[-1]["failure"]["reason"] == f"RunStageError: {ending}"


class EndsUnderAnotherName:
    """A plugin implementing the hook under another function name (pluggy's ``specname``)."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl(specname="telescope_run_end")
    def on_run_end(self, status: str) -> None:
        self.calls += 1
        raise RuntimeError("plugin bug under another name")


def test_each_plugin_is_called_once_and_blamed_only_for_its_own_error(tmp_path: Path) -> None:
    named, failing = EndsUnderAnotherName(), FailsOnRunEnd()
    pm, recorder = recording_plugin_manager(named, failing)
    hub = FakeHub()
    _end_run(pm, hub, FakeSession(), "failed", RuntimeError("trainer died"), tmp_path)  # type: ignore[arg-type]
    assert named.calls == 1 and recorder.ends == ["failed"]
    failures = {(f["plugin"], f["error"]) for f in hub.infos[-1]["hook_failures"]}
    assert failures == {
        (pm.get_name(named), "RuntimeError: plugin bug under another name"),
        (pm.get_name(failing), "RuntimeError: plugin bug in run_end"),
    }


class StubSession:
    """Stands in for the run's Ray session: training is replaced by ``outcome`` (raised when an exception)."""

    outcome: BaseException | None = None
    stopped = 0

    def __init__(self, *args: Any) -> None:
        self.resume = self.run_id = self.logger_ids = None

    def stop(self) -> None:
        StubSession.stopped += 1


def run_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, outcome: BaseException | None, plugin: object
) -> Path:
    """``run_training`` with the real hub and run directory, its training replaced by ``outcome``."""

    def train(sessions: list[Any], *args: Any) -> None:
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(driver, "RunSession", StubSession)
    monkeypatch.setattr(driver, "_train_recovering", train)
    StubSession.stopped = 0
    run_dir = tmp_path / "run"
    cfg = make_config(
        model="some/model", inference_engine="transformers", run_dir=str(run_dir), use_wandb=False
    )
    pset, registry = registry_with(("watch", plugin))
    driver.run_training(cfg, pset, registry)
    return run_dir


def test_a_failed_run_whose_plugin_raises_at_its_end_reports_the_run_error_in_run_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match="trainer died") as raised:
        run_with(monkeypatch, tmp_path, RuntimeError("trainer died"), FailsOnRunEnd())
    assert raised.value.__context__ is None  # not chained to (hidden behind) the plugin's error
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed" and StubSession.stopped == 1
    assert meta["info"]["failure"]["reason"] == "RuntimeError: trainer died"
    assert meta["info"]["hook_failures"] == [
        {"hook": "telescope_run_end", "plugin": "watch", "error": "RuntimeError: plugin bug in run_end"}
    ]


def test_an_interrupted_run_whose_plugin_raises_at_its_end_stays_interrupted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(KeyboardInterrupt):  # the CLI's exit code 130, not a failure's 1
        run_with(monkeypatch, tmp_path, KeyboardInterrupt(), FailsOnRunEnd())
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


def test_a_run_that_succeeded_then_a_plugin_raised_at_its_end_is_failed_in_run_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(RunStageError, match="the telescope_run_end hook of plugin 'watch' failed"):
        run_with(monkeypatch, tmp_path, None, FailsOnRunEnd())
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed" and StubSession.stopped == 1
    assert "telescope_run_end hook of plugin 'watch'" in meta["info"]["failure"]["reason"]
