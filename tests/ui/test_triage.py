"""Issue #33 in a real browser (Playwright driving Debian's chromium): a stuck step is visible,
reward comes first, zoom survives new keys, the timeline scales and says what is wrong, the
Custom view is dragged and kept on the server, tracebacks are errors, rollouts sort and deep
link, charts explain their keys."""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_browser import Page, launch, require_browser, wait_plotted, wait_points
from ui_runs import append_frame, log_step, start_hub, step_rows, write_run

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.server import ServerThread
from telescope.core.observe import LoggerHub, RolloutRecord, TimelineEvent

sync_api = require_browser()
PAGES = ("runs", "metrics", "rollouts", "timeline", "infra", "evals", "logs")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch(sync_api)


class Clock:
    """A settable clock for the local logger: steps logged 'in the past'."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stuck_run(run_dir: Path, step_s: float = 2.0, frozen_s: float = 660.0) -> LoggerHub:
    """Three steps every ``step_s`` seconds, the last one ``frozen_s`` seconds ago; then nothing
    but system samples (as frozen ranks: the files keep being written)."""
    clock = Clock(time.time() - frozen_s - 3 * step_s)
    hub = start_hub(run_dir, clock=clock, number_of_steps=60)
    for step in (1, 2, 3):
        clock.t += step_s
        log_step(hub, step)
    clock.t = time.time()
    hub.log_system({"time": time.time(), "source": "system", "metrics": {"cpu_utilization_percent": 3.0}})
    hub.tick()
    return hub


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerThread, dict[str, LoggerHub]]]:
    write_run(tmp_path / "runs" / "done", steps=4)
    hubs = {"stuck": stuck_run(tmp_path / "runs" / "stuck")}
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    yield srv, hubs
    srv.stop()
    for hub in hubs.values():
        hub.finish("finished")


def open_tab(browser: Any, served: Any, route: str) -> tuple[Page, Any]:
    """A new tab on the ``served`` runs, at ``route``."""
    tab = Page(browser, served[0].url)
    return tab, tab.open(route)


# ---- 1. a stuck step is visible ----------------------------------------------------------------
def test_a_stuck_step_is_red_on_every_page_with_how_long(browser: Any, served: Any, tmp_path: Path) -> None:
    srv, _ = served
    tab = Page(browser, srv.url)
    for page in PAGES:
        p = tab.open(f"{page}?runs=stuck")
        p.wait_for_selector("#health.overdue")
        text = p.inner_text("#health")
        # step 4 started when step 3 was logged, 11 minutes ago; steps took 2 s
        assert "overdue: step 4 running for 11m" in text and "(median step 2s)" in text, (page, text)
        assert "last step 11m" in text
        assert "overdue" in (p.get_attribute("#live", "class") or "")
    p = tab.open("runs")
    row = p.inner_text("#runs-table tr:has(a[href='#/metrics?runs=stuck'])")
    assert "running: step overdue" in row and "step 4 running for 11m" in row
    # a finished run's pages say nothing is running
    p = tab.open("metrics?runs=done")
    assert p.get_attribute("#health", "data-state") == "ended"
    assert "running for" not in p.inner_text("#health")
    p.screenshot(path=str(tmp_path / "stuck.png"))
    assert not tab.errors


# ---- 2. reward on top ----------------------------------------------------------------------------
def test_metrics_open_on_an_overview_and_sections_collapse_and_pin(browser: Any, served: Any) -> None:
    tab, p = open_tab(browser, served, "metrics?runs=done")
    p.wait_for_selector('details[data-section="Overview"] .chart[data-key="reward/mean"]')
    sections = p.eval_on_selector_all("details.section", "ds => ds.map(d => d.dataset.section)")
    assert sections[0] == "Overview" and sections[1] == "General"
    overview = p.eval_on_selector_all(
        'details[data-section="Overview"] .chart', "cs => cs.map(c => c.dataset.key)"
    )
    # the run logs reward/mean, entropy and discarded/pct of the Overview's list, in its order
    assert overview == ["reward/mean", "entropy", "discarded/pct"]
    # pin 'debug': it moves up to right after the Overview, and stays there after a reload
    p.click('details[data-section="debug"] summary .pin')
    p.wait_for_function("document.querySelectorAll('details.section')[1].dataset.section === 'debug'")
    p.click('details[data-section="reward"] summary')  # collapse 'reward'
    # the browser remembers it (the toggle event comes a task later: wait for it before reloading)
    p.wait_for_function(
        "JSON.parse(localStorage.getItem('telescope.metrics.collapsed') || '[]').includes('reward')"
    )
    p.reload()
    p.wait_for_selector('details[data-section="Overview"]')
    assert p.eval_on_selector_all("details.section", "ds => ds.map(d => d.dataset.section)")[:2] == [
        "Overview",
        "debug",
    ]
    assert p.evaluate("document.querySelector('details[data-section=\"reward\"]').open") is False
    assert not tab.errors


def test_runs_page_shows_a_reward_sparkline_last_update_speed_and_eta(browser: Any, served: Any) -> None:
    tab, p = open_tab(browser, served, "runs")
    row = "#runs-table tr:has(a[href='#/metrics?runs=stuck'])"
    p.wait_for_selector(f"{row} svg.sparkline path")
    # one point per logged step: M + 2 L for steps 1..3
    path = p.get_attribute(f"{row} svg.sparkline path", "d") or ""
    assert path.count("M") == 1 and path.count("L") == 2
    assert p.inner_text(f"{row} td.last-update").startswith("11m")
    assert p.inner_text(f"{row} td.speed") == "2.00 s/step"
    assert p.inner_text(f"{row} td.eta") == "1m54s"  # 57 steps left of 60 at the median 2 s
    assert not tab.errors


# ---- 3. zoom survives new keys -----------------------------------------------------------------
def test_zoom_survives_a_new_metric_key(browser: Any, tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "runs" / "live")
    for step in (1, 2, 3):
        log_step(hub, step)
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        tab = Page(browser, srv.url)
        p = tab.open("metrics?runs=live")
        chart = "document.querySelector('.chart[data-key=\"entropy\"]')"
        wait_plotted(p, '.chart[data-key="entropy"]')
        p.evaluate(f"Plotly.relayout({chart}, {{'xaxis.range': [1, 2]}})")
        # a discard reason seen for the first time: a new key, a new chart, the page redrawn
        hub.log_step(4, {"entropy": 0.25, "discarded/never_seen/count": 1.0})
        p.wait_for_selector('.chart[data-key="discarded/never_seen/count"]', state="attached", timeout=5000)
        wait_plotted(p, '.chart[data-key="entropy"]')
        wait_points(p, '.chart[data-key="entropy"]', "==", 4, timeout=5000)
        assert p.evaluate(f"{chart}.layout.xaxis.range") == [1, 2]
        assert not tab.errors
    finally:
        srv.stop()
        hub.finish("finished")


# ---- 4. the timeline -----------------------------------------------------------------------------
def busy_run(run_dir: Path, steps: int = 10, servers: int = 2, lanes: int = 16) -> None:
    """``steps`` steps, each with a sample on every lane of every server, and trainer timings
    adding up to more than the train_step span (phases must still be drawn inside it)."""
    hub = start_hub(run_dir, number_of_steps=steps)
    t = time.time() - steps * 10
    for step in range(1, steps + 1):
        events = []
        for server in range(servers):
            for lane in range(lanes):
                gid, start = server * lanes + lane, t + 0.1 * lane
                for phase, at in (("start", start), ("end", start + 4 + lane % 3)):
                    events.append(
                        dict(
                            type="generation",
                            phase=phase,
                            step=step,
                            group_id=gid,
                            sample_id=0,
                            server=server,
                            lane=lane,
                            time=at,
                        )
                    )
        events.append(dict(type="trainer", phase="start", name="train_step", step=step, time=t + 7))
        events.append(dict(type="trainer", phase="end", name="train_step", step=step, time=t + 9))
        hub.log_events([TimelineEvent(**e) for e in events])
        hub.log_step(
            step,
            {
                "entropy": 1.0,
                "timing_forward_total": 1.5,
                "timing_backward_total": 1.5,
                "timing_loss_computation_total": 0.5,
                "timing_data_to_device_total": 0.25,
            },
        )
        t += 10
    hub.finish("finished")


def _step_of(hover_text: str) -> int:
    found = re.search(r"step (\d+)", hover_text)
    assert found, hover_text
    return int(found.group(1))


def test_timeline_validates_ranges_groups_lanes_and_draws_phases_inside_steps(
    browser: Any, tmp_path: Path
) -> None:
    busy_run(tmp_path / "runs" / "busy")
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        tab = Page(browser, srv.url)
        p = tab.open("timeline?runs=busy&from=1&to=10")
        wait_plotted(p, "#timeline-chart")
        rows = p.evaluate("[...new Set(document.querySelector('#timeline-chart').data.flatMap(t => t.y))]")
        # 32 lanes in two rows, one per server
        assert sorted(r for r in rows if r.startswith("server")) == ["server 0", "server 1"]
        assert p.evaluate("document.querySelector('#timeline-chart').getBoundingClientRect().height") < 900
        # the legend is above the chart, and every trainer phase has its own colour
        legend_y = p.evaluate("document.querySelector('#tl-legend').getBoundingClientRect().top")
        assert legend_y < p.evaluate("document.querySelector('#timeline-chart').getBoundingClientRect().top")
        colours = p.evaluate(
            "Object.fromEntries(document.querySelector('#timeline-chart').data.map(t => [t.name, t.marker.color]))"
        )
        phases = {k: v for k, v in colours.items() if k.startswith("phase:")}
        assert set(phases) == {"phase: forward", "phase: backward", "phase: loss", "phase: data_to_device"}
        assert len(set(phases.values())) == 4 and colours["trainer"] not in phases.values()
        # phases inside their step: 3.75 s of timings drawn within each 2 s train_step
        bars = p.evaluate("""(() => { const d = document.querySelector('#timeline-chart').data; const out = {};
            for (const t of d) if (t.type === 'bar') out[t.name] = t.base.map((b, i) => [b, b + t.x[i], t.text[i]]); return out; })()""")
        steps = {_step_of(text): (b, e) for b, e, text in bars["trainer"]}
        assert sorted(steps) == list(range(1, 11))
        for name in phases:
            for b, e, text in bars[name]:
                lo, hi = steps[_step_of(text)]
                assert lo - 1e-6 <= b and e <= hi + 1e-6, (name, b, e, lo, hi)
        # expand server 1: its 16 lanes get a row each
        p.click('#tl-servers button[data-server="server 1"]')
        p.wait_for_function(
            "document.querySelector('#timeline-chart').data.some(t => t.y.includes('server 1 / lane 15'))"
        )
        # a range with 'from' after 'to' is refused on the page; the chart stays
        p.fill("#tl-from", "9")
        p.fill("#tl-to", "3")
        p.dispatch_event("#tl-to", "change")
        p.wait_for_selector("#timeline-error:not([hidden])")
        assert "'from' (9) is after 'to' (3)" in p.inner_text("#timeline-error")
        p.fill("#tl-to", "12")
        p.dispatch_event("#tl-to", "change")
        p.wait_for_selector("#timeline-error[hidden]", state="attached")
        # more than 50 steps: said on the page
        p = tab.open("timeline?runs=busy&from=1&to=80")
        p.wait_for_selector("#timeline-error:not([hidden])")
        assert "80 steps: the timeline shows at most 50" in p.inner_text("#timeline-error")
        assert not [e for e in tab.errors if "400" not in e]
    finally:
        srv.stop()


# ---- 5. the Custom view ---------------------------------------------------------------------------
def add_section(p: Any, name: str, *keys: str) -> None:
    p.fill("#new-section", name)
    p.click("#add-section")
    box = f'.custom-section[data-section="{name}"]'
    p.wait_for_selector(box)
    for key in keys:
        p.fill(f"{box} input[list]", key)
        p.dispatch_event(f"{box} input[list]", "change")
        p.wait_for_selector(f'{box} .chip[data-key="{key}"]')


def test_custom_view_drags_sections_and_metrics_and_is_kept_next_to_the_runs(
    browser: Any, served: Any, tmp_path: Path
) -> None:
    tab, p = open_tab(browser, served, "metrics?runs=done&view=custom")
    add_section(p, "first", "entropy", "reward/mean")
    add_section(p, "second", "reward/max")
    # drag the second section's handle onto the first: the order swaps
    p.drag_and_drop(
        '.custom-section[data-section="second"] .drag-handle', '.custom-section[data-section="first"]'
    )
    p.wait_for_function("document.querySelector('.custom-section').dataset.section === 'second'")
    # drag reward/mean before entropy, then entropy into the other section
    first = '.custom-section[data-section="first"]'
    p.drag_and_drop(f'{first} .chip[data-key="reward/mean"]', f'{first} .chip[data-key="entropy"]')
    p.wait_for_function(f"document.querySelector('{first} .chip').dataset.key === 'reward/mean'")
    p.drag_and_drop(f'{first} .chip[data-key="entropy"]', '.custom-section[data-section="second"]')
    p.wait_for_selector('.custom-section[data-section="second"] .chip[data-key="entropy"]')
    saved = json.loads((tmp_path / "runs" / ".telescope-ui" / "layout.json").read_text())
    expected = [
        {"name": "second", "keys": ["reward/max", "entropy"]},
        {"name": "first", "keys": ["reward/mean"]},
    ]
    assert saved == {"sections": expected}
    # another host name (localhost, not 127.0.0.1) and a fresh browser context: the same layout
    other = browser.new_context()
    page = other.new_page()
    page.goto(served[0].url.replace("127.0.0.1", "localhost") + "/#/metrics?runs=done&view=custom")
    page.wait_for_selector('.custom-section[data-section="second"] .chart[data-key="entropy"]')
    names = page.eval_on_selector_all(".custom-section", "ss => ss.map(s => s.dataset.section)")
    assert names == ["second", "first"]
    # export under a name, change the layout, import it back
    page.fill("#export-name", "mine")
    page.click("#export-layout")
    page.wait_for_selector('#import-name option[value="mine"]', state="attached")
    assert (tmp_path / "runs" / ".telescope-ui" / "layouts" / "mine.json").exists()
    page.click('.custom-section[data-section="first"] button:has-text("remove section")')
    page.wait_for_function("document.querySelectorAll('.custom-section').length === 1")
    page.click("#import-layout")
    page.wait_for_function("document.querySelectorAll('.custom-section').length === 2")
    # a name that is a path is refused, on the page
    page.fill("#export-name", "../escape")
    page.click("#export-layout")
    page.wait_for_selector("#layout-error")
    assert "is not a plain name" in page.inner_text("#layout-error")
    assert not (tmp_path / "runs" / "escape.json").exists()
    other.close()
    assert not tab.errors
    # a damaged layout file: the sections view still draws, the Custom view says what is wrong
    (tmp_path / "runs" / ".telescope-ui" / "layout.json").write_text("{not json")
    damaged = Page(browser, served[0].url)
    p = damaged.open("metrics?runs=done")
    wait_plotted(p, '.chart[data-key="entropy"]')
    p = damaged.open("metrics?runs=done&view=custom")
    p.wait_for_selector("#layout-error")
    assert "layout.json is not a readable layout" in p.inner_text("#layout-error")


# ---- 6. logs -------------------------------------------------------------------------------------
def test_logs_show_a_failures_traceback_at_error_and_jump_to_it(browser: Any, served: Any) -> None:
    srv, _ = served
    logs = srv.workspace.get("done").path / "logs"
    logs.mkdir(exist_ok=True)
    lines = ["2026-01-01 10:00:00,001 INFO telescope.runtime started"]
    lines += [f"2026-01-01 10:00:{i:02d},001 INFO telescope.progress step {i}" for i in range(1, 60)]
    lines += [
        "2026-01-01 10:01:00,001 INFO telescope.orchestrator step 3: train_step failed",
        "Traceback (most recent call last):",
        '  File "trainer.py", line 10, in train_step',
        "RuntimeError: CUDA error: an illegal memory access",
        "2026-01-01 10:01:00,002 ERROR telescope.runtime training failed: step 3: train_step failed",
    ]
    (logs / "telescope.log").write_text("\n".join(lines) + "\n")
    tab = Page(browser, srv.url)
    p = tab.open("logs?runs=done&level=ERROR")
    p.wait_for_selector("#log-lines div")
    shown = [d.inner_text() for d in p.query_selector_all("#log-lines div")]
    assert [s.removeprefix("[driver] ") for s in shown] == lines[-5:]
    p = tab.open("logs?runs=done")
    p.wait_for_selector("#log-lines div")
    p.click("#jump-error")
    marked = p.inner_text("#log-lines div.jumped")
    assert marked.endswith("step 3: train_step failed") and "INFO" in marked  # the traceback's head line
    in_view = p.evaluate("""(() => { const box = document.querySelector('#log-lines').getBoundingClientRect();
        const r = document.querySelector('#log-lines div.jumped').getBoundingClientRect();
        return r.top >= box.top && r.bottom <= box.bottom; })()""")
    assert in_view
    assert not tab.errors


# ---- 7. rollouts ---------------------------------------------------------------------------------
def test_rollouts_sort_summarise_the_filtered_rows_and_deep_link_a_sample(browser: Any, served: Any) -> None:
    tab, p = open_tab(browser, served, "rollouts?runs=done&step=3")
    p.wait_for_selector("#rollout-table")

    def rewards() -> list[float]:
        shown = p.eval_on_selector_all("#rollout-table tr.clickable", "rs => rs.map(r => r.dataset.reward)")
        return [float(r) for r in shown]

    everything = [r.reward for r in step_rows(3)]
    p.click('#rollout-table th[data-sort="reward"]')
    p.wait_for_selector('#rollout-table th[data-sort="reward"]:has-text("▲")')
    assert rewards() == sorted(everything)
    p.click('#rollout-table th[data-sort="reward"]')
    p.wait_for_selector('#rollout-table th[data-sort="reward"]:has-text("▼")')
    assert rewards() == sorted(everything, reverse=True)
    # the summary is over what the filters let through: kept samples with reward >= 0.3
    p.fill("#f-reward_min", "0.3")
    p.press("#f-reward_min", "Enter")
    p.wait_for_selector("text=summary of the rollouts the filters show")
    kept = [r.reward for r in step_rows(3) if r.discard_reason is None and r.reward >= 0.3]
    mean = p.inner_text("#step-summary table tr:nth-child(2) td:nth-child(2)")
    assert float(mean) == pytest.approx(statistics.mean(kept), abs=1e-4)
    # an outcome name is shown whole
    rows = [
        RolloutRecord(
            step=5,
            group_id=g,
            env="reverse_text",
            sample_id=0,
            discard_reason="zero_advantage",
            completion_ids=[1],
        )
        for g in range(40)
    ]
    append_frame(
        served[0].workspace.get("done").path / "rollouts" / "block_000000.jsonl.zst",
        *[r.to_dict() for r in rows],
    )
    # a deep link to sample 0 of group 33 (far down the list): scrolled to and marked
    p = tab.open("rollouts?runs=done&step=5&group=33&sample=0")
    p.wait_for_selector("#rollout-table tr.selected")
    selected = p.query_selector("#rollout-table tr.selected")
    assert selected.get_attribute("data-group") == "33"
    in_view = p.evaluate("""(() => { const box = document.querySelector('#rollout-list').getBoundingClientRect();
        const r = document.querySelector('#rollout-table tr.selected').getBoundingClientRect();
        return r.top >= box.top && r.bottom <= box.bottom; })()""")
    assert in_view
    cut = p.eval_on_selector_all(
        "#rollout-table tr.clickable td:nth-child(6)",
        "tds => tds.filter(td => td.scrollWidth > td.clientWidth).length",
    )
    assert p.inner_text("#rollout-table tr.selected td:nth-child(6)") == "zero_advantage" and cut == 0
    assert not tab.errors


# ---- 8. chart titles, duplicates, counts, hover ---------------------------------------------------
def test_charts_explain_their_keys_hide_duplicates_count_the_filter_and_share_hover(
    browser: Any, tmp_path: Path
) -> None:
    hub = start_hub(tmp_path / "runs" / "perf")
    for step in (1, 2, 3):
        hub.log_step(
            step,
            {
                "reward/mean": step / 4,
                "entropy": 1.0 / step,
                "async_level": 1.0,
                "perf/async_level": 1.0,
                "perf/step_time_s": 2.0 + step,
                "grad_norm": 0.5,
            },
        )
    hub.finish("finished")
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        tab = Page(browser, srv.url)
        p = tab.open("metrics?runs=perf")
        wait_plotted(p, '.chart[data-key="reward/mean"]')
        keys = set(p.eval_on_selector_all(".chart", "cs => cs.map(c => c.dataset.key)"))
        assert "perf/async_level" in keys and "async_level" not in keys
        # the registry, imported here: without it, this test fails on its own (the others run)
        from telescope.cli.ui.metric_docs import describe

        assert (
            p.get_attribute('.chart[data-key="reward/mean"]', "title")
            == f"reward/mean: {describe('reward/mean')}"
        )
        assert p.inner_text("#metric-count") == "5 metrics"
        p.fill("#metric-filter", "perf")
        p.dispatch_event("#metric-filter", "change")
        p.wait_for_selector("#metric-count:has-text('2 of 5 metrics')")
        # hovering one chart shows the same step in the others
        p = tab.open("metrics?runs=perf")
        for key in ("reward/mean", "entropy"):
            wait_plotted(p, f'details[data-section="Overview"] .chart[data-key="{key}"]')
        box = p.query_selector('.chart[data-key="reward/mean"] .nsewdrag').bounding_box()
        p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # over step 2 of 1..3
        p.wait_for_function(
            "document.querySelector('.chart[data-key=\"entropy\"] .hoverlayer').textContent.includes('0.5')",
            timeout=3000,
        )
        assert not tab.errors
    finally:
        srv.stop()
