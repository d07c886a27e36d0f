"""``telescope ui`` on a big synthetic run: how soon the Metrics page is interactive after the
server starts, how fast the data API answers, and the server's memory.

Run: ``.venv/bin/python bench/ui.py [--steps 1000] [--rollouts 256] [--repeat 3] [--dir /tmp/telescope-ui-bench]``.
The server's output goes to ``<dir>-server.log``; a server not answering within
``--server-deadline`` seconds (120) stops the benchmark with that log's tail.

Writes (once; reused while the parameters match) a run directory (compressed blocks, as runs write them) of ``steps`` x
``rollouts`` rollout records (token id lists and texts of realistic size, in 500-step blocks),
four timeline events per rollout plus trainer spans, and one metrics record per step with
~120 keys. Then, ``--repeat`` times: starts ``telescope ui`` as its own process, and as soon as
it answers HTTP, opens the Metrics page in a fresh context of an already running headless
chromium (the server's first client: nothing read or cached yet). The page's performance marks
give, from navigation start: its data received, the first chart visible (a static SVG preview),
plotly.min.js compiled and run, and the first plotly chart drawn (hover and zoom work: the page
is interactive; target <= 2 s); then twice more in the same context, the third visit showing
a returning user's browser (plotly.min.js and V8's compiled code for it cached). Chrome's CPU
time of the page's main thread and renderer process up to the first plotly chart is printed
too: unlike the wall clock it does not grow with the machine's load (other processes), so it
tells how long the page takes on an idle machine. Then the data API is timed with one request at a time: the
Rollouts page for one step cold (its block not yet indexed) and warm, with a reward filter
(target <= 300 ms), one sample, the Timeline of one step, the Infra page's system samples (one
a second from four sources) twice; and the server's resident memory
(VmRSS, VmHWM; target <= 500 MB).

Each figure is printed as median [min .. max] over the repeats, with the machine's load
average: figures are wall clock on this machine; compare them only on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BLOCK = 500
ENV_NAMES = ("countdown", "math")


def _metrics(step: int, rng: random.Random) -> dict[str, float]:
    out = {
        "entropy": 1.0 / (1 + step / 100),
        "grad_norm": rng.random(),
        "learning_rate": 1e-6,
        "kl_divergence_inference": rng.random() / 100,
    }
    for section in (
        "reward",
        "advantage",
        "tokens/prompt",
        "tokens/completion",
        "tokens/total",
        "sample_metrics/correct",
        "sample_metrics/length",
        "discarded/tokens/completion",
    ):
        for stat in ("mean", "std", "min", "max"):
            out[f"{section}/{stat}"] = rng.random()
    for name in (
        "forward",
        "backward",
        "loss_computation",
        "data_to_device",
        "prepare_tensors",
        "compute_kl",
        "compute_entropy",
        "weight_sync_trainer",
        "weight_sync_inference",
        "step",
    ):
        out[f"timing_{name}_total"] = rng.random()
        out[f"timing_{name}_microbatch_mean"] = rng.random() / 8
    for i in range(50):
        out[f"custom/group{i % 5}/m{i}"] = rng.random()
    return out


def _row(
    step: int, gid: int, sid: int, rng: random.Random, prompt_len: int, completion_len: int, now: float
) -> dict:
    reward = float(rng.random() > 0.5)
    return {
        "step": step,
        "group_id": step * 1000 + gid,
        "env": ENV_NAMES[gid % 2],
        "sample_id": sid,
        "prompt_idx": gid,
        "prompt_text": "<|im_start|>user\nSolve: "
        + "x + 1 = 2 " * (prompt_len // 4)
        + "<|im_end|>\n<|im_start|>assistant\n",
        "prompt_ids": [rng.randrange(32000) for _ in range(prompt_len)],
        "completion_text": "Let me think. " * (completion_len // 4) + f"The answer is {sid}.",
        "completion_ids": [rng.randrange(32000) for _ in range(completion_len)],
        "reward": reward,
        "raw_reward": reward,
        "sample_metrics": {"correct": reward, "length": completion_len},
        "advantage": reward - 0.5,
        "model_version": step - 1,
        "off_policy_steps": 1,
        "stop_reason": "stop",
        "discard_reason": None,
        "zero_advantage_kind": None,
        "server": gid % 4,
        "lane": sid,
        "timings": {},
        "num_turns": 1,
        "time": now,
        "kept": True,
        "prompt_tokens": prompt_len,
        "completion_tokens": completion_len,
    }


def _events(step: int, rows: list[dict], t: float) -> list[dict]:
    out = []
    for r in rows:
        ids = {"name": "", "step": step, "group_id": r["group_id"], "sample_id": r["sample_id"]}
        lane = {"server": r["server"], "lane": r["lane"], "rank": None}
        out += [
            {"type": "generation", "phase": "start", **ids, **lane, "time": t, "attrs": {}},
            {"type": "generation", "phase": "end", **ids, **lane, "time": t + 2, "attrs": {}},
            {
                "type": "reward",
                "phase": "start",
                **ids,
                "server": None,
                "lane": None,
                "rank": None,
                "time": t + 2,
                "attrs": {},
            },
            {
                "type": "reward",
                "phase": "end",
                **ids,
                "server": None,
                "lane": None,
                "rank": None,
                "time": t + 2.1,
                "attrs": {},
            },
        ]
    tr = {
        "type": "trainer",
        "name": "train_step",
        "step": step,
        "group_id": None,
        "sample_id": None,
        "server": None,
        "lane": None,
        "rank": None,
        "attrs": {},
    }
    return out + [{**tr, "phase": "start", "time": t + 2.2}, {**tr, "phase": "end", "time": t + 3.0}]


def write_run(root: Path, steps: int, per_step: int, prompt_len: int, completion_len: int) -> None:
    from telescope.core.observe.rundir.frames import compress_lines
    from telescope.core.observe.rundir.records import SCHEMA_VERSION

    stamp = json.dumps([steps, per_step, prompt_len, completion_len, "system", "zstd"])
    if (root / "bench.json").exists() and (root / "bench.json").read_text() == stamp:
        return
    shutil.rmtree(root, ignore_errors=True)
    (root / "rollouts").mkdir(parents=True)
    (root / "events").mkdir()
    rng, t0 = random.Random(0), time.time() - steps * 3
    run = {
        "schema_version": SCHEMA_VERSION,
        "run_id": "bench",
        "name": "bench",
        "status": "finished",
        "created_at": t0,
        "started_at": t0,
        "finished_at": t0 + steps * 3,
        "starts": 1,
        "layout": {"rollout_block_size": BLOCK, "event_block_duration_seconds": 1800.0},
        "info": {"environments": [{"name": n, "reward_min": 0.0, "reward_max": 1.0} for n in ENV_NAMES]},
    }
    (root / "run.json").write_text(json.dumps(run))
    (root / "config.yaml").write_text(f"algorithm: grpo\nnumber_of_steps: {steps}\ngroup_size: 16\n")
    groups = max(per_step // 16, 1)
    with open(root / "metrics.jsonl", "w") as metrics:
        for step in range(steps):
            t = t0 + 3 * step
            rows = [
                _row(step, g, s, rng, prompt_len, completion_len, t)
                for g in range(groups)
                for s in range(per_step // groups)
            ]
            # the blocks as a run writes them: a zstd frame per step
            with open(root / "rollouts" / f"block_{step // BLOCK:06d}.jsonl.zst", "ab") as f:
                f.write(compress_lines([(json.dumps(r) + "\n").encode() for r in rows]))
            with open(root / "events" / f"block_{int(3 * step // 1800):06d}.jsonl.zst", "ab") as f:
                f.write(compress_lines([(json.dumps(e) + "\n").encode() for e in _events(step, rows, t)]))
            metrics.write(json.dumps({"step": step, "time": t + 3, "metrics": _metrics(step, rng)}) + "\n")
    _write_system(root / "system.jsonl", t0, steps * 3, rng)
    (root / "bench.json").write_text(stamp)


#: system.jsonl's sources: the machine, one vLLM server, two trainer ranks (one sample a second each).
SOURCES = (
    {"source": "system", "node": "n1"},
    {"source": "vllm", "server": 0},
    {"source": "torch", "rank": 0},
    {"source": "torch", "rank": 1},
)


def _write_system(path: Path, t0: float, seconds: int, rng: random.Random) -> None:
    with open(path, "w") as f:
        for s in range(seconds):
            for source in SOURCES:
                metrics = {f"metric_{k}": rng.random() for k in range(12)}
                f.write(json.dumps({"time": t0 + s, **source, "metrics": metrics}) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return bytes(resp.read())


def _timed(url: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    body = _get(url)
    return time.perf_counter() - t, body


def _rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


#: Performance marks the page sets (common.js, metrics.js), in the order they happen.
MARKS = (
    ("metrics-data", "Metrics page data in the browser"),
    ("first-preview", "first chart visible (static SVG preview)"),
    ("plotly-ready", "plotly.min.js compiled and run"),
    ("first-chart", "first plotly chart drawn: page interactive"),
)


def _launch_chromium(p: Any) -> Any:
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    return p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])


def _page_marks(browser: Any, url: str, visits: int) -> list[dict[str, float]]:
    """Per visit, seconds from navigation start to each of ``MARKS``, in one fresh browser
    context: the first visit is cold; Chrome caches plotly.min.js (``max-age``) and, from the
    second load of a script on, its compiled code, so the third visit is a returning user's."""
    context = browser.new_context()
    out = []
    for _ in range(visits):
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.goto(url + "/#/metrics")
        page.wait_for_function("performance.getEntriesByName('first-chart').length > 0", timeout=120_000)
        marks = page.evaluate(
            "() => Object.fromEntries(performance.getEntriesByType('mark').map(m => [m.name, m.startTime / 1000]))"
        )
        # CPU time of the page's main thread so far: what the wall clock would be on an idle core
        # (the network waits overlap it), whatever else the machine runs
        cpu = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        out.append(
            {name: float(marks[name]) for name, _ in MARKS if name in marks}
            | {"thread": cpu.get("ThreadTime", 0.0), "process": cpu.get("ProcessTime", 0.0)}
        )
        page.close()
    context.close()
    return out


def _start_server(run_dir: Path, log: Path, deadline_s: float) -> tuple[subprocess.Popen[bytes], str, float]:
    """``telescope ui`` as its own process, its output in ``log``: (process, base url, seconds
    to its first answer)."""
    port = _free_port()
    exe = Path(sys.executable).parent / "telescope"
    base = f"http://127.0.0.1:{port}"
    t_spawn = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(exe), "ui", str(run_dir), "--no-browser", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
    _wait_for_server(proc, base + "/api/poll", log, deadline_s)
    return proc, base, time.perf_counter() - t_spawn


def _wait_for_server(proc: subprocess.Popen[bytes], url: str, log: Path, deadline_s: float) -> None:
    """Poll ``url`` until it answers; a server that exits or is not up within ``deadline_s``
    stops the benchmark with its URL, the time waited, its exit code and the tail of ``log``
    (a hung start would otherwise hang the benchmark forever). A server that does not exit is
    killed."""
    start = time.perf_counter()
    while True:
        try:
            # a short timeout: a server that accepts but never answers is retried, not waited on
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            pass
        waited = time.perf_counter() - start
        code = proc.poll()
        if code is None and waited < deadline_s:
            time.sleep(0.02)
            continue
        if code is None:
            proc.kill()
            proc.wait(10)
            state = f"still running after {waited:.1f} s (--server-deadline {deadline_s:g}); killed"
        else:
            state = f"exited with code {code} after {waited:.1f} s"
        tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
        raise SystemExit(
            f"telescope ui never answered {url}: {state}. Last lines of its output ({log}):\n"
            + ("\n".join(tail) or "(none)")
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(10)


def _api_rows(base: str, steps: int) -> list[tuple[str, float | None, str]]:
    t = time.perf_counter()
    runs = json.loads(_get(base + "/api/runs"))["runs"]
    key = runs[0]["key"]
    _get(f"{base}/api/runs/{key}/catalog")
    series = json.loads(_get(f"{base}/api/runs/{key}/metrics?keys=*"))
    t_metrics = time.perf_counter() - t
    mid = steps * 3 // 4
    api = f"{base}/api/runs/{key}"
    return [
        (
            f"Metrics page data over HTTP (runs, catalog, {len(series['values'])} series x {len(series['step'])} steps)",
            t_metrics,
            "-",
        ),
        (
            f"Rollouts step {mid}, first request (block may be warming)",
            _timed(f"{api}/rollouts?step={mid}")[0],
            "<= 0.3 s",
        ),
        (f"Rollouts step {mid + 1}, warm", _timed(f"{api}/rollouts?step={mid + 1}")[0], "<= 0.3 s"),
        (
            f"Rollouts step {mid + 2}, reward >= 0.5",
            _timed(f"{api}/rollouts?step={mid + 2}&reward_min=0.5")[0],
            "<= 0.3 s",
        ),
        (
            f"Rollouts step {mid}, one sample in full",
            _timed(f"{api}/sample?step={mid}&group={mid * 1000}&sample=3")[0],
            "-",
        ),
        (f"Timeline step {mid}, first request", _timed(f"{api}/timeline?from={mid}&to={mid}")[0], "-"),
        (f"Timeline step {mid + 1}, warm", _timed(f"{api}/timeline?from={mid + 1}&to={mid + 1}")[0], "-"),
        (f"Infra page data ({steps * 3 * len(SOURCES):,} system samples)", _timed(f"{api}/system")[0], "-"),
        ("Infra page data again, nothing appended", _timed(f"{api}/system")[0], "-"),
    ]


def _print_marks(visits: list[dict[str, Any]]) -> None:
    """One row per page mark (median [min .. max] over ``visits``); the first plotly chart has the target."""
    for mark, name in MARKS:
        values = [v[mark] for v in visits if mark in v]
        if values:
            target = "<= 2 s" if mark == "first-chart" else "-"
            print(f"{'  ' + name:74s} {_spread(values)}  {target}")


def _spread(values: list[float]) -> str:
    values = sorted(values)
    if len(values) == 1:
        return f"{values[0]:9.3f}"
    return f"{values[len(values) // 2]:9.3f}  [{values[0]:.3f} .. {values[-1]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=256, help="rollouts per step")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=192)
    parser.add_argument(
        "--repeat", type=int, default=3, help="server starts (each with a fresh browser context)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/telescope-ui-bench"))
    parser.add_argument(
        "--server-deadline",
        type=float,
        default=120.0,
        help="seconds a server start may take before the benchmark stops with its log",
    )
    args = parser.parse_args()
    t = time.perf_counter()
    write_run(args.dir, args.steps, args.rollouts, args.prompt_tokens, args.completion_tokens)
    size = sum(p.stat().st_size for p in args.dir.rglob("*.jsonl*")) / 2**20
    print(
        f"synthetic run: {args.steps} steps x {args.rollouts} rollouts, {size:,.0f} MiB of records ({time.perf_counter() - t:.1f} s to write or reuse)"
    )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    runs: list[dict[str, float]] = []
    returning: list[dict[str, float]] = []
    api_rows: list[list[tuple[str, float | None, str]]] = []
    with contextlib.ExitStack() as stack:
        browser = _launch_chromium(stack.enter_context(sync_playwright())) if sync_playwright else None
        if browser is None:
            print("(no playwright or chromium: browser figures skipped)")
        for _ in range(args.repeat):
            proc, base, up = _start_server(
                args.dir, args.dir.with_name(args.dir.name + "-server.log"), args.server_deadline
            )
            try:
                # the browser is the server's first client: nothing read or cached yet
                visits = _page_marks(browser, base, 3) if browser is not None else [{}, {}, {}]
                api_rows.append(_api_rows(base, args.steps))
                rss, peak = _rss_mb(proc.pid)
            finally:
                _stop(proc)
            runs.append({"up": up, **visits[0], "rss": rss, "peak": peak})
            returning.append(visits[-1])
    n = len(runs)
    print(
        f"\n{n} server start(s); median [min .. max] seconds; the machine's load: {os.getloadavg()[0]:.1f} (1-min average)"
    )
    print(f"{'measure':74s} {'seconds':>9s}  target")
    print(f"{'telescope ui process start -> first HTTP answer':74s} {_spread([r['up'] for r in runs])}  -")
    print("Metrics page in headless chromium, from navigation start (server just up, cold):")
    _print_marks(runs)
    for key, name in (
        ("thread", "  CPU time of the page's main thread by then (not slowed by load)"),
        ("process", "  CPU time of the page's renderer process by then (all its threads)"),
    ):
        values = [r[key] for r in runs if key in r]
        if values:
            print(f"{name:74s} {_spread(values)}  -")
    print("The same, third visit in that browser context (plotly and its compiled code cached):")
    _print_marks(returning)
    print("Data API afterwards (urllib, one request at a time):")
    for i, (name, _, target) in enumerate(api_rows[0]):
        values = [float(rows[i][1] or 0.0) for rows in api_rows]
        print(f"{'  ' + name:74s} {_spread(values)}  {target}")
    print(
        f"{'server memory after all of it: VmRSS / VmHWM peak (MB, worst run)':74s} {max(r['rss'] for r in runs):6.0f} / {max(r['peak'] for r in runs):.0f}  <= 500 MB"
    )


if __name__ == "__main__":
    main()
