"""The end of a failed run stops every worker and closes the run even when a plugin raises on the way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from telescope.core import hookimpl
from telescope.core.runtime.driver import _end_run
from telescope.core.testing import recording_hooks


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

    def stop_sources(self) -> None:
        self.calls.append("stop_sources")

    def finish(self, status: str) -> None:
        self.calls.append(f"finish {status}")


class FailsOnRunInfo:
    @hookimpl
    def telescope_run_info(self, info: dict[str, Any]) -> None:
        raise RuntimeError("plugin bug in run_info")


def test_a_plugin_raising_while_the_failure_is_recorded_still_stops_the_workers(tmp_path: Path) -> None:
    hook, recorder = recording_hooks(FailsOnRunInfo())
    session, hub = FakeSession(), FakeHub()
    with pytest.raises(RuntimeError, match="plugin bug in run_info"):
        _end_run(hook, hub, session, "failed", RuntimeError("trainer died"), tmp_path)  # type: ignore[arg-type]
    assert session.stopped == 1
    assert hub.calls == ["stop_sources", "finish failed"]
    assert recorder.ends == ["failed"]  # the other plugins still hear how the run ended
