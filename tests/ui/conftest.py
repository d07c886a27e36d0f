"""Dashboard test fixtures (the run-directory writers are in ui_runs.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# --import-mode=importlib keeps test folders off sys.path: let the tests import ui_runs
sys.path.insert(0, str(Path(__file__).parent))

from ui_runs import write_run

if TYPE_CHECKING:
    from telescope.cli.ui.server import ServerThread


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    write_run(tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    """The dashboard over one finished run ``one`` of 3 steps, on a free loopback port."""
    from telescope.cli.ui.data import Workspace
    from telescope.cli.ui.server import ServerThread

    write_run(tmp_path / "runs" / "one", steps=3)
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    yield srv
    srv.stop()
