"""The browser the dashboard tests drive: Debian's headless chromium launched by path through
Playwright (no browser download), and a tab that records console errors."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from telescope.cli.ui.server import plotly_js_path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def require_browser() -> ModuleType:
    """playwright.sync_api; the calling test module is skipped when playwright, chromium or plotly is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (scripts/install-chromium.sh)", allow_module_level=True)
    if plotly_js_path() is None:
        pytest.skip("plotly is not installed (pip install 'telescope-cli[ui]')", allow_module_level=True)
    return sync_api


def launch(sync_api: ModuleType) -> Iterator[Any]:
    """A chromium browser for a module's tests (a fixture yields from it)."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900}, timezone_id="UTC")
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, route: str) -> Any:
        self.page.goto(f"{self.base}/#/{route}")
        self.page.wait_for_load_state("networkidle")
        return self.page

    def points(self, key: str, trace: int = 0) -> int:
        selector = f'.chart[data-key="{key}"]'
        wait_plotted(self.page, selector)
        return int(self.page.evaluate(f"document.querySelector('{selector}').data[{trace}].x.length"))


# A chart is drawn when plotly has set its data and layout and made its svg: the svg alone is not
# enough (a page redraw can put a new chart element in the old one's place between two reads).
PLOTTED = """sel => {
  const el = document.querySelector(sel);
  return !!(el && el.data && el.data.length && el.layout && el.querySelector('.main-svg'));
}"""


def wait_plotted(page: Any, selector: str, timeout: float = 30_000) -> None:
    """Wait until the element `selector` names holds a plotly chart with its traces."""
    page.wait_for_function(PLOTTED, arg=selector, timeout=timeout)


POINTS = """([sel, op, n]) => {
  const el = document.querySelector(sel);
  const x = el && el.data && el.data[0] && el.data[0].x;
  return !!x && (op === '>' ? x.length > n : x.length === n);
}"""


def wait_points(page: Any, selector: str, op: str, n: int, timeout: float = 30_000) -> None:
    """Wait until the chart ``selector`` names has ``op`` (``'>'`` or ``'=='``) ``n`` points in its first
    trace; a chart element swapped in by a redraw, not drawn yet, counts as not there yet."""
    page.wait_for_function(POINTS, arg=[selector, op, n], timeout=timeout)
