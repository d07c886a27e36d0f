"""The dashboard's Metrics page shows each run's health findings above its Overview charts (a real
browser on a run directory the real sentinel and LoggerHub wrote). Skipped without chromium."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_health_display import collapsed_run

sys.path.insert(0, str(Path(__file__).parents[1] / "ui"))  # the dashboard tests' browser

from ui_browser import Page, launch, require_browser

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.server import ServerThread

sync_api = require_browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch(sync_api)


def test_metrics_overview_shows_the_findings(browser: Any, tmp_path: Path) -> None:
    collapsed_run(tmp_path)  # tmp_path/run
    srv = ServerThread(Workspace([tmp_path])).start()
    try:
        tab = Page(browser, srv.url)
        p = tab.open("metrics?runs=run")
        box = p.wait_for_selector("#health-findings .health-run.warning")
        state, finding = box.query_selector(".health-state"), box.query_selector(".finding")
        assert state.inner_text() == "run: warning, 1 finding"
        assert finding.inner_text().startswith("step 12 entropy_collapse (warn): entropy 0.2 is below 0.25")
        # the box comes before the Overview section
        assert p.evaluate(
            "document.querySelector('#health-findings').compareDocumentPosition("
            "document.querySelector('[data-section=Overview]')) & Node.DOCUMENT_POSITION_FOLLOWING"
        )
        assert not tab.errors
    finally:
        srv.stop()
