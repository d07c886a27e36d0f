"""The dashboard in a real browser: Playwright driving Debian's headless chromium (launched by
path; no browser download). Skipped when playwright or chromium is missing.

Screenshots of every page go to the test's tmp dir (``<tmp>/shots/<page>.png``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_browser import Page, launch, require_browser, wait_plotted, wait_points
from ui_runs import append_frame, append_jsonl, log_step, start_hub, step_rows, write_run

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.server import ServerThread

PAGES = ("runs", "metrics", "rollouts", "timeline", "infra", "evals", "logs")

sync_api = require_browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch(sync_api)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[ServerThread, Any]]:
    """A finished run and a live one (its hub still open) under one parent folder."""
    write_run(tmp_path / "runs" / "done", steps=4)
    hub = start_hub(tmp_path / "runs" / "live")
    for step in (1, 2, 3):
        log_step(hub, step)
    logs = tmp_path / "runs" / "done" / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "telescope.log").write_text(
        "2026-01-01 10:00:00,001 INFO telescope.runtime started\n"
        "2026-01-01 10:00:01,001 WARNING telescope.runtime slow\n"
    )
    (tmp_path / "runs" / "empty").mkdir()  # a run that died before logging anything
    (tmp_path / "runs" / "empty" / "run.json").write_text('{"schema_version": 2, "status": "running"}')
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    yield srv, hub
    srv.stop()
    hub.finish("finished")


def test_every_page_loads_without_console_errors(
    browser: Any, live: tuple[ServerThread, Any], tmp_path: Path
) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    shots = tmp_path / "shots"
    shots.mkdir()
    for page in PAGES:
        p = tab.open(f"{page}?runs=done")
        p.wait_for_timeout(400)
        p.screenshot(path=str(shots / f"{page}.png"), full_page=False)
        assert not p.query_selector("p.error"), f"{page}: {p.inner_text('main')}"
        assert not tab.errors, f"{page}: {tab.errors}"
    assert sorted(f.name for f in shots.iterdir()) == sorted(f"{page}.png" for page in PAGES)
    p = tab.open("runs")
    assert p.inner_text("#runs-table").count("finished") == 1 and "running" in p.inner_text("#runs-table")
    said = {}
    for page in PAGES:  # a run with nothing logged yet: each page says so, nothing breaks
        p = tab.open(f"{page}?runs=empty")
        p.wait_for_timeout(200)
        assert not p.query_selector("p.error") and not tab.errors, (
            f"{page}: {p.inner_text('main')} {tab.errors}"
        )
        said[page] = p.inner_text("main")
    assert "No step logged yet" in said["timeline"] and "No log files yet" in said["logs"]
    # a hidden tab does not poll; shown again, it polls at once
    polls: list[float] = []
    p.on("request", lambda r: polls.append(time.monotonic()) if "/api/poll" in r.url else None)
    visibility = "Object.defineProperty(document, 'hidden', {configurable: true, get: () => %s}); document.dispatchEvent(new Event('visibilitychange'))"
    p.evaluate(visibility % "true")
    p.wait_for_timeout(1200)  # a poll already scheduled may still run once
    hidden_at = time.monotonic()
    p.wait_for_timeout(2000)
    assert not [t for t in polls if t > hidden_at]
    p.evaluate(visibility % "false")
    p.wait_for_timeout(300)
    assert [t for t in polls if t > hidden_at]
    assert "No step metrics yet" in said["metrics"] and "No rollouts logged yet" in said["rollouts"]


def test_chart_has_one_point_per_step_and_runs_overlay(browser: Any, live: tuple[ServerThread, Any]) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    p = tab.open("metrics?runs=done")
    wait_plotted(p, '.chart[data-key="entropy"]')
    assert tab.points("entropy") == 4
    assert p.evaluate("document.querySelector('.chart[data-key=\"entropy\"]').data[0].y[1]") == 0.5
    # a declared range fixes the y axis: reward/mean is drawn on [0, 1] (+3% padding)
    p.evaluate("document.querySelector('.chart[data-key=\"reward/mean\"]').scrollIntoView()")
    wait_plotted(p, '.chart[data-key="reward/mean"]')
    y_range = p.evaluate("document.querySelector('.chart[data-key=\"reward/mean\"]').layout.yaxis.range")
    assert y_range == pytest.approx([-0.03, 1.03])
    # a constant series (0.5 at every step) is centred on its value, not drawn on [-0.5, 1.5]
    p.evaluate("document.querySelector('.chart[data-key=\"timing_forward_total\"]').scrollIntoView()")
    wait_plotted(p, '.chart[data-key="timing_forward_total"]')
    y_range = p.evaluate(
        "document.querySelector('.chart[data-key=\"timing_forward_total\"]').layout.yaxis.range"
    )
    assert y_range == pytest.approx([0.25, 0.75])
    # the unit its name says is in the title; a name that says none gets none
    title = "document.querySelector('.chart[data-key=\"%s\"]').layout.title.text"
    assert p.evaluate(title % "timing_forward_total") == "timing_forward_total (s)"
    assert p.evaluate(title % "entropy") == "entropy"
    units = {
        "timing_step_total": "s",
        "perf/step_time_s": "s",
        "e2e_request_latency_seconds_mean": "s",
        "perf/tokens_per_s": "tokens/s",
        "memory/peak_rss_gb": "GB",
        "weight_sync/bytes": "bytes",
        "discarded/max_async/pct": "%",
        "gpu/*/gpu_utilization_percent": "%",
        "gpu/*/gpu_power_w": "W",
        "gpu/*/gpu_temperature_c": "°C",
        "gpu/*/gpu_clock_sm_mhz": "MHz",
        "tokens/completion/mean": "tokens",
        "batch/num_tokens": "tokens",
        "loss_tokens": "tokens",
        "prompt_tokens_total": "tokens",
        "kv_cache_usage_perc": "",
        "reward/mean": "",
        "learning_rate": "",
        "sample_metrics/tokens_ok/mean": "",
    }
    got = p.evaluate(
        "async keys => { const { unitOf } = await import('/static/common.js'); return keys.map(unitOf); }",
        list(units),
    )
    assert dict(zip(units, got, strict=True)) == units
    p = tab.open("metrics?runs=done&x=time")
    wait_plotted(p, '.chart[data-key="entropy"]')
    xaxis = p.evaluate("document.querySelector('.chart[data-key=\"entropy\"]').layout.xaxis.title.text")
    assert xaxis == "seconds since the run started"
    p = tab.open("metrics?runs=done,live")
    wait_plotted(p, '.chart[data-key="entropy"]')
    assert [tab.points("entropy", i) for i in (0, 1)] == [4, 3]
    assert p.query_selector('details[data-section="debug"] .group-title').inner_text() == "grads"
    assert not tab.errors


def test_charts_show_a_preview_before_plotly_then_the_plotly_chart(
    browser: Any, live: tuple[ServerThread, Any]
) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    p = tab.open("metrics?runs=done")
    wait_plotted(p, '.chart[data-key="entropy"]')
    marks = p.evaluate(
        "Object.fromEntries(performance.getEntriesByType('mark').map(m => [m.name, m.startTime]))"
    )
    # the page loads plotly only once its charts are drawn as previews (app.js)
    assert marks["metrics-data"] <= marks["first-preview"] < marks["plotly-ready"] <= marks["first-chart"]
    # every preview is replaced by plotly's chart (the Overview's and the sections' in view)
    p.wait_for_function("!document.querySelector('.chart .preview-svg')", timeout=10_000)
    # the preview's geometry, against coordinates computed here: margins l=48 r=12 t=28 b=32
    path = p.evaluate("""async () => {
        const { drawPreview } = await import('/static/preview.js');
        const el = document.createElement('div');
        el.style.cssText = 'width:460px;height:260px';
        document.body.append(el);
        drawPreview(el, [{ x: [0, 1, 2, 3], y: [0, 2, null, 1], line: { color: 'red' } }], { yaxis: { range: [0, 4] } });
        return el.querySelector('path').getAttribute('d');
    }""")
    sx = [48 + i / 3 * (460 - 60) for i in range(4)]
    sy = [260 - 32 - v / 4 * (260 - 60) for v in (0, 2, 0, 1)]
    # the null at x=2 breaks the line: a new segment starts at x=3
    assert path == f"M{sx[0]:.1f},{sy[0]:.1f}L{sx[1]:.1f},{sy[1]:.1f}M{sx[3]:.1f},{sy[3]:.1f}"
    assert not tab.errors


def test_filtering_rollouts_by_reward(browser: Any, live: tuple[ServerThread, Any]) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    p = tab.open("rollouts?runs=done&step=2")
    p.wait_for_selector("#rollout-table")
    assert len(p.query_selector_all("#rollout-table tr.clickable")) == len(step_rows(2))
    # every column in view, the completion cut to fit (no scrolling sideways to find it)
    fits = "(() => { const c = document.querySelector('#rollout-table').parentElement; return [c.scrollWidth, c.clientWidth]; })()"
    scroll_width, client_width = p.evaluate(fits)
    assert scroll_width <= client_width
    p.fill("#f-reward_min", "0.5")
    p.press("#f-reward_min", "Enter")
    expected = sorted(r.reward for r in step_rows(2) if r.reward >= 0.5)
    p.wait_for_function(
        f"document.querySelectorAll('#rollout-table tr.clickable').length === {len(expected)}"
    )
    shown = [
        float(tr.get_attribute("data-reward")) for tr in p.query_selector_all("#rollout-table tr.clickable")
    ]
    assert sorted(shown) == expected
    assert "reward_min=0.5" in p.url  # deep link
    p.query_selector("#rollout-table tr.clickable").click()
    p.wait_for_selector("#rollout-detail .part.tool_call")
    p.click("#show-group")
    p.wait_for_selector("#group-cols .panel")
    assert len(p.query_selector_all("#group-cols .panel")) == 4
    assert not tab.errors


def test_live_metrics_line_and_first_rollouts_appear_within_3s(
    browser: Any, live: tuple[ServerThread, Any], tmp_path: Path
) -> None:
    srv, hub = live
    tab = Page(browser, srv.url)
    p = tab.open("metrics?runs=live")
    wait_plotted(p, '.chart[data-key="entropy"]')
    assert tab.points("entropy") == 3
    chart = "document.querySelector('.chart[data-key=\"entropy\"]')"
    p.evaluate(f"Plotly.relayout({chart}, {{'xaxis.range': [1, 2]}})")  # the user zooms in
    log_step(hub, 4)
    wait_points(p, '.chart[data-key="entropy"]', "==", 4, timeout=3000)
    assert p.evaluate(f"{chart}.layout.xaxis.range") == [1, 2]  # the new step kept the zoom
    first_errors = tab.errors
    # the Rollouts page of a run that has logged no step yet shows its first step once logged
    fresh = start_hub(tmp_path / "runs" / "fresh")
    try:
        srv.workspace.scan(force=True)
        tab = Page(browser, srv.url)  # a new tab: it lists the new run
        p = tab.open("rollouts?runs=fresh")
        p.wait_for_selector("text=No rollouts logged yet.")
        log_step(fresh, 1)
        p.wait_for_selector("#rollout-table tr.clickable", timeout=3000)
        assert (
            p.inner_text("#rollout-count") == f"{len(step_rows(1))} of {len(step_rows(1))} rollouts of step 1"
        )
        log_step(fresh, 2)  # newer steps: offered by the step picker, the list stays on step 1
        log_step(fresh, 3)  # two steps within one poll: both are offered, not only the latest
        p.wait_for_selector('#step option[value="3"]', state="attached", timeout=3000)
        assert p.eval_on_selector_all("#step option", "os => os.map(o => o.value)") == ["1", "2", "3"]
        assert "of step 1" in p.inner_text("#rollout-count")
        p.click("#next-step")
        p.wait_for_selector("text=rollouts of step 2")
    finally:
        fresh.finish("finished")
    assert not tab.errors and not first_errors


def test_timeline_and_logs_pages(browser: Any, live: tuple[ServerThread, Any]) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    p = tab.open("timeline?runs=done&from=2&to=3")
    wait_plotted(p, "#timeline-chart")
    names = p.evaluate("document.querySelector('#timeline-chart').data.map(t => t.name)")
    assert {"generation", "reward", "trainer", "phase: forward", "phase: backward"} <= set(names)
    p = tab.open("logs?runs=done&level=WARNING")
    p.wait_for_selector("#log-lines div")
    assert [line.inner_text() for line in p.query_selector_all("#log-lines div")][-1].endswith("slow")
    assert len(p.query_selector_all("#log-lines div")) == 1
    assert not tab.errors


def test_logs_page_hides_the_detailed_log_follows_new_components_and_stops_when_finished(
    browser: Any, live: tuple[ServerThread, Any]
) -> None:
    srv, _ = live
    done, running = (srv.workspace.get(k).path / "logs" for k in ("done", "live"))
    (done / "telescope.detailed.log").write_text(
        "2026-01-01 10:00:00,001 INFO telescope.runtime local.py:3 started\n"
    )
    tab = Page(browser, srv.url)
    requests: list[str] = []
    tab.page.on("request", lambda r: requests.append(r.url.split("?")[0].rsplit("/", 1)[-1]))
    # the detailed log repeats the driver's lines: unticked, and its lines not shown
    p = tab.open("logs?runs=done")
    p.wait_for_selector("#log-lines div")
    assert not p.is_checked('input[data-component="driver (detailed)"]')
    assert [d.inner_text() for d in p.query_selector_all("#log-lines div")] == [
        "[driver] 2026-01-01 10:00:00,001 INFO telescope.runtime started",
        "[driver] 2026-01-01 10:00:01,001 WARNING telescope.runtime slow",
    ]
    # a finished run writes no more lines: after the page's load, at most one more request in
    # three polls (the page polls every second)
    loaded = len(requests)
    while requests[loaded:].count("poll") < 3:
        p.wait_for_timeout(50)
    assert requests[loaded:].count("logs") <= 1, requests[loaded:]
    # a live run: a server that starts logging after the page opened gets its box and lines
    running.mkdir(exist_ok=True)
    (running / "telescope.log").write_text("2026-01-01 10:00:00,001 INFO telescope.runtime started\n")
    p = tab.open("logs?runs=live")
    p.wait_for_selector("#log-lines div")
    (running / "inference").mkdir()
    (running / "inference" / "server_0.log").write_text(
        "2026-01-01 10:00:02,001 telescope.inference INFO up\n"
    )
    p.wait_for_selector('input[data-component="server 0"]:checked', timeout=3000)
    p.wait_for_function("document.querySelector('#log-lines').innerText.includes('[server 0]')", timeout=3000)
    assert not tab.errors


def test_evals_page_charts_each_metric_and_shows_samples(
    browser: Any, live: tuple[ServerThread, Any], tmp_path: Path
) -> None:
    srv, _ = live
    tab = Page(browser, srv.url)
    p = tab.open("evals?runs=done")
    wait_plotted(p, '.chart[data-key="math/pass@1"]')
    assert tab.points("math/pass@1") == 2  # evals at steps 2 and 4
    assert p.evaluate("document.querySelector('.chart[data-key=\"math/pass@1\"]').data[0].y") == [0.2, 0.4]
    p.click("#evals tr.clickable >> nth=1")
    p.wait_for_selector("text=math at step 4: 3 samples")
    # no eval results: the page says why (none configured, or when the configured ones run)
    p = tab.open("evals?runs=live")
    assert "this run's config has none" in p.inner_text("#evals p.muted")
    hub = start_hub(tmp_path / "runs" / "evals", evals=[{"name": "reverse_text", "eval_every": 5}])
    try:
        srv.workspace.scan(force=True)
        tab2 = Page(browser, srv.url)  # a new tab: it lists the new run
        text = tab2.open("evals?runs=evals").inner_text("#evals p.muted")
    finally:
        hub.finish("finished")
    assert "Evals run: reverse_text every 5 steps; before training; after training." in text
    assert not tab.errors and not tab2.errors


def test_token_view_colours_by_logprob_when_the_record_has_them(
    browser: Any, live: tuple[ServerThread, Any], tmp_path: Path
) -> None:
    srv, _ = live
    # a record with the token view's fields (rollout_token_view_max_tokens): texts and logprobs,
    # null for a token the environment wrote
    row = {
        **step_rows(4)[0].to_dict(),
        "group_id": 9,
        "completion_ids": [5, 6, 7, 8],
        "completion_token_texts": ["Hel", "lo", "\n", " world"],
        "completion_logprobs": [0.0, -0.7, None, -5.0],
        "timings": {"generation_start": 1767261600.25, "generation_s": 0.5},  # 2026-01-01 10:00:00.250 UTC
    }
    append_frame(srv.workspace.get("done").path / "rollouts" / "block_000000.jsonl.zst", row)
    tab = Page(browser, srv.url)
    p = tab.open("rollouts?runs=done&step=4&group=9&sample=0")
    p.wait_for_selector("#token-view span")
    spans = p.query_selector_all("#token-view span")
    assert [s.inner_text() for s in spans] == ["Hel", "lo", "↵", " world"]
    # hue = 120 * probability: green for p=1, ~60 for p=0.5, red for p~0; the environment's token grey
    assert [s.get_attribute("style") for s in spans] == [
        "background:hsl(120, 70%, 85%)",
        "background:hsl(60, 70%, 85%)",
        None,
        "background:hsl(1, 70%, 85%)",
    ]
    assert spans[2].get_attribute("class") == "tok env"
    assert "logprob -0.700" in (spans[1].get_attribute("title") or "")
    kv = p.inner_text("#rollout-detail .kv >> nth=2").split("\n")  # facts, sample metrics, timings
    assert kv == ["generation_start", "10:00:00.250", "generation_s", "0.5000"]
    p.query_selector("#token-view").screenshot(path=str(tmp_path / "token-view.png"))
    assert not tab.errors


def test_infra_page_groups_gpus_and_sources(browser: Any, live: tuple[ServerThread, Any]) -> None:
    srv, _ = live
    system = srv.workspace.get("done").path / "system.jsonl"
    records = [
        {
            "time": 100.0 + i,
            "node": "n1",
            "source": "system",
            "metrics": {
                "cpu_utilization_percent": 50.0,
                "gpu/0/gpu_utilization_percent": 10.0 * i,
                "gpu/1/gpu_utilization_percent": 5.0 * i,
                "gpu/0/gpu_power_w": 300.0,
            },
        }
        for i in range(3)
    ] + [{"time": 101.0, "source": "vllm", "server": 0, "metrics": {"num_requests_running": 4.0}}]
    append_jsonl(system, *records)
    tab = Page(browser, srv.url)
    p = tab.open("infra?runs=done")
    wait_plotted(p, '.chart[data-key="gpu/*/gpu_utilization_percent"]')
    traces = p.evaluate(
        "document.querySelector('.chart[data-key=\"gpu/*/gpu_utilization_percent\"]').data.map(t => [t.name, t.y])"
    )
    assert traces == [["gpu 0", [0, 10, 20]], ["gpu 1", [0, 5, 10]]]
    legend = "document.querySelector('.chart[data-key=\"%s\"]').layout.showlegend"
    assert p.evaluate(legend % "gpu/*/gpu_utilization_percent") is True  # two GPUs: which line is which
    wait_plotted(p, '.chart[data-key="cpu_utilization_percent"]')
    assert p.evaluate(legend % "cpu_utilization_percent") is False
    # new samples: drawn into the same chart, the user's zoom kept
    chart = "document.querySelector('.chart[data-key=\"gpu/*/gpu_utilization_percent\"]')"
    p.evaluate(f"{chart}._seen = true; Plotly.relayout({chart}, {{'xaxis.range': [0, 1]}})")
    append_jsonl(system, {**records[2], "time": 103.0})
    wait_points(p, '.chart[data-key="gpu/*/gpu_utilization_percent"]', "==", 4, timeout=5000)
    assert p.evaluate(f"[{chart}._seen, {chart}.layout.xaxis.range]") == [True, [0, 1]]
    assert (
        p.evaluate(
            "document.querySelector('.chart[data-key=\"gpu/*/gpu_utilization_percent\"]').layout.title.text"
        )
        == "gpu/*/gpu_utilization_percent (%)"
    )
    sources = [d.get_attribute("data-source") for d in p.query_selector_all("details[data-source]")]
    assert sources == ["system n1", "vllm server 0"]
    assert not tab.errors


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_dashboard_follows_a_real_quickstart_run(browser: Any, tmp_path: Path) -> None:
    """The quickstart (real Ray, transformers engine, FSDP trainer; 30 steps) served while it
    trains (12 steps: 1 to 3 min here): new steps reach the Metrics chart and new lines the Logs
    page without a reload; then every page of the finished run, screenshots under ``<tmp>/shots``."""
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "runs" / "quickstart"
    run_dir.parent.mkdir()
    exe = Path(sys.executable).parent / "telescope"
    cmd = [
        str(exe),
        "train",
        str(root / "examples" / "quickstart.yaml"),
        "--number_of_steps",
        "12",
        "--run_dir",
        str(run_dir),
    ]
    with open(tmp_path / "train.out", "w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    srv = ServerThread(Workspace([run_dir.parent])).start()
    try:
        deadline = time.monotonic() + 400
        while _lines(run_dir / "metrics.jsonl") < 2:
            assert proc.poll() is None, (tmp_path / "train.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "the quickstart logged no 2 steps within 400 s"
            time.sleep(0.5)
        tab = Page(browser, srv.url)
        p = tab.open("metrics?runs=quickstart")
        p.wait_for_selector('.chart[data-key="reward/mean"]')
        p.evaluate(
            "document.querySelector('.chart[data-key=\"reward/mean\"]').scrollIntoView()"
        )  # drawn when in view
        wait_plotted(p, '.chart[data-key="reward/mean"]')
        shown = tab.points("reward/mean")
        # a later step appears in the open page (no reload): the page polls every second
        wait_points(p, '.chart[data-key="reward/mean"]', ">", shown, timeout=120_000)
        logs = tab.open("logs?runs=quickstart")
        logs.wait_for_selector("#log-lines div")
        before = len(logs.query_selector_all("#log-lines div"))
        if proc.poll() is None:  # the run still writes its logs: the page follows them
            logs.wait_for_function(
                f"document.querySelectorAll('#log-lines div').length > {before}", timeout=120_000
            )
        assert proc.wait(600) == 0, (tmp_path / "train.out").read_text()[-3000:]
        shots = tmp_path / "shots"
        shots.mkdir()
        for page in PAGES:
            p = tab.open(f"{page}?runs=quickstart")
            p.wait_for_timeout(1500)
            p.screenshot(path=str(shots / f"{page}.png"))
            assert not p.query_selector("p.error"), f"{page}: {p.inner_text('main')}"
        # the real records carry the token view (completions of <= 24 tokens): coloured spans
        p = tab.open("rollouts?runs=quickstart")
        p.click("#rollout-table tr.clickable >> nth=0")
        p.wait_for_selector("#token-view span[style*=hsl]")
        p.screenshot(path=str(shots / "rollout-sample.png"), full_page=True)
        assert not tab.errors
    finally:
        srv.stop()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
