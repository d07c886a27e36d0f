"""Dashboard test fixtures (the run-directory writers are in ui_runs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# --import-mode=importlib keeps test folders off sys.path: let the tests import ui_runs
sys.path.insert(0, str(Path(__file__).parent))

from ui_runs import write_run


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    write_run(tmp_path / "run")
    return tmp_path / "run"
