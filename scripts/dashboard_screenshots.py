"""The dashboard screenshots of docs/dashboard.md, from synthetic runs written by our own loggers
(the dashboard tests' run writers): the Metrics Overview, a stuck run, a 10-step timeline.

    .venv/bin/python scripts/dashboard_screenshots.py [OUT_DIR]   # default docs/images

Needs playwright and Debian's chromium (scripts/install-chromium.sh).
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ui"))

from test_triage import busy_run, stuck_run  # noqa: E402
from ui_browser import ARGS, CHROMIUM  # noqa: E402
from ui_runs import start_hub  # noqa: E402

from telescope.cli.ui.data import Workspace  # noqa: E402
from telescope.cli.ui.server import ServerThread  # noqa: E402


def learning_run(run_dir: Path, steps: int = 60) -> None:
    """A run that learns: reward per environment rising, entropy and KL falling, some discards."""
    rng = random.Random(0)
    hub = start_hub(run_dir, number_of_steps=steps)
    for step in range(1, steps + 1):
        progress = 1 - math.exp(-step / 18)
        envs = {"reverse_text": 0.2 + 0.7 * progress, "math": 0.1 + 0.5 * progress}
        metrics = {f"reward/{env}/mean": min(1.0, r + rng.gauss(0, 0.04)) for env, r in envs.items()}
        metrics["reward/mean"] = sum(metrics.values()) / 2
        metrics.update(
            {
                "entropy": 0.9 - 0.5 * progress + rng.gauss(0, 0.02),
                "kl_divergence_inference": 0.002 + rng.random() * 0.001,
                "grad_norm": 0.8 + rng.gauss(0, 0.15),
                "discarded/pct": max(0.0, 30 - 25 * progress + rng.gauss(0, 3)),
                "perf/step_time_s": 11 + rng.gauss(0, 0.8),
                "perf/tokens_per_s": 5200 + rng.gauss(0, 300),
                "timing_forward_total": 2.1,
                "timing_backward_total": 4.0,
                "loss/policy": rng.gauss(0, 0.01),
            }
        )
        hub.log_step(step, metrics)
    hub.finish("finished")


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="telescope-shots-"))
    learning_run(tmp / "runs" / "learning")
    hubs = [stuck_run(tmp / "runs" / "stuck")]
    busy_run(tmp / "runs" / "busy", steps=10, servers=4, lanes=32)
    srv = ServerThread(Workspace([tmp / "runs"])).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900}, timezone_id="UTC")
            page.goto(f"{srv.url}/#/metrics?runs=learning")
            page.wait_for_selector(
                'details[data-section="Overview"] .chart[data-key="perf/tokens_per_s"] .main-svg'
            )
            page.wait_for_function("!document.querySelector('.chart .preview-svg')")
            page.screenshot(path=str(out / "dashboard-overview.png"))
            page.goto(f"{srv.url}/#/runs?runs=stuck")
            page.wait_for_selector("#health.overdue")
            page.wait_for_selector("#runs-table svg.sparkline")
            page.screenshot(path=str(out / "dashboard-stuck-run.png"))
            page.goto(f"{srv.url}/#/timeline?runs=busy&from=1&to=10")
            page.wait_for_selector("#timeline-chart .main-svg")
            page.wait_for_timeout(300)
            page.screenshot(path=str(out / "dashboard-timeline.png"))
            browser.close()
    finally:
        srv.stop()
        for hub in hubs:
            hub.finish("finished")
    for name in ("dashboard-overview.png", "dashboard-stuck-run.png", "dashboard-timeline.png"):
        print(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images")
