"""The dashboard's Sandboxes page: the sandbox/* metrics charted by step, and a step's failing or
slowest commands (failing first) with the tails of their output, shown as text and size-capped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_browser import Page, launch, require_browser, wait_plotted
from ui_runs import start_hub

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.sandboxes import TAIL_CHARS, worst_commands
from telescope.cli.ui.server import ServerThread
from telescope.core.observe.rundir.records import TimelineEvent

HOSTILE = "<img src=x onerror=alert(1)>"


def command(step: int, sid: str, seconds: float, exit_code: int | None, **attrs: Any) -> list[TimelineEvent]:
    fields: dict[str, Any] = {
        "sandbox_id": sid,
        "provider": "local",
        "env": "code",
        "command": f"python3 {sid}.py",
    }
    fields |= {"exit_code": exit_code, "duration_s": seconds, "timed_out": False, "oom": False, **attrs}
    return [
        TimelineEvent("sandbox", p, name="execute", step=step, time=1000.0 + t, attrs=fields)
        for p, t in (("start", 0), ("end", seconds))
    ]


def step_events(step: int) -> list[TimelineEvent]:
    return [
        *command(step, "fast", 0.1, 0),
        *command(step, "slow", 5.0, 0),
        *command(step, "crash", 0.2, 1, stderr_tail="x" * 5000 + HOSTILE),
        *command(step, "hang", 3.0, None, timed_out=True),
    ]


def test_failing_commands_come_first_then_the_slowest_with_capped_tails() -> None:
    rows = worst_commands([e.to_dict() for e in step_events(1)])
    assert [r["sandbox_id"] for r in rows] == [
        "hang",
        "crash",
        "slow",
        "fast",
    ]  # failing by duration, then the rest
    assert len(rows[1]["stderr_tail"]) == TAIL_CHARS and rows[1]["stderr_tail"].endswith(HOSTILE)
    assert worst_commands([e.to_dict() for e in step_events(1)], limit=2)[-1]["sandbox_id"] == "crash"


sync_api = require_browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch(sync_api)


def test_the_page_charts_the_metrics_and_lists_the_commands_as_text(browser: Any, tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "runs" / "code")
    for step in (1, 2, 3):
        hub.log_step(
            step, {"sandbox/exec_p95_s": 5.0 * step, "sandbox/live": 2.0, "sandbox/nonzero_exits": 1.0}
        )
        hub.log_events(step_events(step))
    hub.finish("finished")
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        tab = Page(browser, srv.url)
        page = tab.open("sandboxes?runs=code")
        wait_plotted(page, '.chart[data-key="sandbox/exec_p95_s"]')
        page.wait_for_selector("#sandbox-commands")
        cells = page.eval_on_selector_all(
            "#sandbox-commands tr.failing td:first-child", "els => els.map(e => e.textContent)"
        )
        assert cells == ["hang", "crash"]
        assert page.evaluate("document.querySelectorAll('#sandboxes img').length") == 0  # the tail is text
        shown = page.evaluate("document.querySelector('#sandbox-commands').textContent")  # folded tails too
        assert (
            HOSTILE in shown and "x" * (TAIL_CHARS - len(HOSTILE)) in shown and "x" * TAIL_CHARS not in shown
        )
        page.screenshot(path=str(tmp_path / "sandboxes.png"), full_page=True)
        assert not tab.errors, tab.errors
    finally:
        srv.stop()


def test_a_metric_never_measured_is_said_so_not_charted_as_zero(browser: Any, tmp_path: Path) -> None:
    """bubblewrap without a cgroup measures no CPU time: the run has no sandbox/cpu_s_per_sample, and the
    page says "not measured" (with why) in its place, and in each command's CPU cell, instead of a 0."""
    hub = start_hub(tmp_path / "runs" / "nocpu")
    for step in (1, 2):
        hub.log_step(step, {"sandbox/exec_p50_s": 0.1 * step, "sandbox/execs": 4.0, "sandbox/creates": 1.0})
        hub.log_events(command(step, "ok", 0.1, 0))
    hub.finish("finished")
    workspace = Workspace([tmp_path / "runs"])
    data = workspace.get("nocpu").sandboxes(None)
    missing = {m["key"]: m["why"] for m in data["not_measured"]}
    assert "sandbox/cpu_s_per_sample" in missing and "cgroup" in missing["sandbox/cpu_s_per_sample"]
    assert "sandbox/exec_p50_s" not in missing and "sandbox/create_to_ready_p95_s" in missing
    srv = ServerThread(workspace).start()
    try:
        tab = Page(browser, srv.url)
        page = tab.open("sandboxes?runs=nocpu")
        wait_plotted(page, '.chart[data-key="sandbox/exec_p50_s"]')
        cpu = page.wait_for_selector('.chart.not-measured[data-key="sandbox/cpu_s_per_sample"]')
        assert "not measured" in cpu.text_content() and "cgroup" in cpu.text_content()
        assert page.query_selector('.chart[data-key="sandbox/cpu_s_per_sample"] .plot-container') is None
        cells = page.eval_on_selector_all("#sandbox-commands td.num", "els => els.map(e => e.textContent)")
        assert "not measured" in cells
        assert not tab.errors, tab.errors
    finally:
        srv.stop()


def test_each_sandbox_gets_its_own_timeline_row_and_concurrent_calls_pair_right() -> None:
    """Two sandboxes whose commands overlap (A 0-2 s, B 1-3 s): each span keeps its own start and end
    and lies on its sandbox's row (paired on the kind alone, A's end closed B's start)."""
    from telescope.cli.ui.timeline import build_spans

    events = [*command(1, "A", 2.0, 0), *command(1, "B", 2.0, 0)]
    events[2:4] = [  # B starts 1 s after A
        TimelineEvent("sandbox", e.phase, name="execute", step=1, time=e.time + 1.0, attrs=e.attrs)
        for e in events[2:4]
    ]
    spans, _ = build_spans([e.to_dict() for e in events])
    got = sorted((s["row"], s["start"] - 1000.0, s["end"] - 1000.0) for s in spans)
    assert got == [("sandbox A", 0.0, 2.0), ("sandbox B", 1.0, 3.0)]
