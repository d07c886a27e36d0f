"""``telescope ui`` on a big synthetic run: how soon the pages' data is ready, and the server's memory.

Run: ``.venv/bin/python bench/ui.py [--steps 1000] [--rollouts 256] [--dir /tmp/telescope-ui-bench]``.

Writes (once; reused while the parameters match) a schema-2 run directory of ``steps`` x
``rollouts`` rollout records (token id lists and texts of realistic size, in 500-step blocks),
four timeline events per rollout plus trainer spans, and one metrics record per step with
~120 keys. Then starts ``telescope ui`` as its own process and times, side by side:

- the Metrics page's data (runs list, metric catalog, every series) from process start and from
  the server's first answer (targets: <= 2 s);
- the Rollouts page's data for one step: cold (the step's block not yet indexed) and warm
  (another step of an indexed block), plus with a reward filter (target: <= 300 ms);
- the Timeline of one step (cold, warm);
- the Metrics page in headless chromium until its first chart is drawn (when Playwright and
  chromium are present);
- the server's resident memory (VmRSS, VmHWM) after all of it (target: <= 500 MB).

Figures are wall clock on this machine; compare them only on the same machine.
"""

from __future__ import annotations

import argparse
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
    return out  # fmt: skip


def _row(
    step: int, gid: int, sid: int, rng: random.Random, prompt_len: int, completion_len: int, now: float
) -> dict:
    reward = float(rng.random() > 0.5)
    return {
        "step": step, "group_id": step * 1000 + gid, "env": ENV_NAMES[gid % 2], "sample_id": sid, "prompt_idx": gid,
        "prompt_text": "<|im_start|>user\nSolve: " + "x + 1 = 2 " * (prompt_len // 4) + "<|im_end|>\n<|im_start|>assistant\n",
        "prompt_ids": [rng.randrange(32000) for _ in range(prompt_len)],
        "completion_text": "Let me think. " * (completion_len // 4) + f"The answer is {sid}.",
        "completion_ids": [rng.randrange(32000) for _ in range(completion_len)],
        "reward": reward, "raw_reward": reward, "sample_metrics": {"correct": reward, "length": completion_len},
        "advantage": reward - 0.5, "model_version": step - 1, "off_policy_steps": 1, "stop_reason": "stop",
        "discard_reason": None, "zero_advantage_kind": None, "server": gid % 4, "lane": sid, "timings": {},
        "num_turns": 1, "time": now, "kept": True, "prompt_tokens": prompt_len, "completion_tokens": completion_len,
    }  # fmt: skip


def _events(step: int, rows: list[dict], t: float) -> list[dict]:
    out = []
    for r in rows:
        ids = {"name": "", "step": step, "group_id": r["group_id"], "sample_id": r["sample_id"]}
        lane = {"server": r["server"], "lane": r["lane"], "rank": None}
        out += [{"type": "generation", "phase": "start", **ids, **lane, "time": t, "attrs": {}},
                {"type": "generation", "phase": "end", **ids, **lane, "time": t + 2, "attrs": {}},
                {"type": "reward", "phase": "start", **ids, "server": None, "lane": None, "rank": None, "time": t + 2, "attrs": {}},
                {"type": "reward", "phase": "end", **ids, "server": None, "lane": None, "rank": None, "time": t + 2.1, "attrs": {}}]  # fmt: skip
    tr = {"type": "trainer", "name": "train_step", "step": step, "group_id": None, "sample_id": None, "server": None,
          "lane": None, "rank": None, "attrs": {}}  # fmt: skip
    return out + [{**tr, "phase": "start", "time": t + 2.2}, {**tr, "phase": "end", "time": t + 3.0}]


def write_run(root: Path, steps: int, per_step: int, prompt_len: int, completion_len: int) -> None:
    stamp = json.dumps([steps, per_step, prompt_len, completion_len])
    if (root / "bench.json").exists() and (root / "bench.json").read_text() == stamp:
        return
    shutil.rmtree(root, ignore_errors=True)
    (root / "rollouts").mkdir(parents=True)
    (root / "events").mkdir()
    rng, t0 = random.Random(0), time.time() - steps * 3
    run = {"schema_version": 2, "run_id": "bench", "name": "bench", "status": "finished", "created_at": t0,
           "started_at": t0, "finished_at": t0 + steps * 3, "starts": 1,
           "layout": {"rollout_block_size": BLOCK, "event_block_duration_seconds": 1800.0},
           "info": {"environments": [{"name": n, "reward_min": 0.0, "reward_max": 1.0} for n in ENV_NAMES]}}  # fmt: skip
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
            with open(root / "rollouts" / f"block_{step // BLOCK:06d}.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            with open(root / "events" / f"block_{int(3 * step // 1800):06d}.jsonl", "a") as f:
                f.write("".join(json.dumps(e) + "\n" for e in _events(step, rows, t)))
            metrics.write(json.dumps({"step": step, "time": t + 3, "metrics": _metrics(step, rng)}) + "\n")
    (root / "bench.json").write_text(stamp)


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


def _browser_first_chart(url: str) -> float | None:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        t = time.perf_counter()
        page.goto(url + "/#/metrics")
        page.wait_for_selector('.chart[data-key="entropy"] .main-svg', timeout=60_000)
        took = time.perf_counter() - t
        browser.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=256, help="rollouts per step")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=192)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/telescope-ui-bench"))
    args = parser.parse_args()
    t = time.perf_counter()
    write_run(args.dir, args.steps, args.rollouts, args.prompt_tokens, args.completion_tokens)
    size = sum(p.stat().st_size for p in args.dir.rglob("*.jsonl")) / 2**20
    print(
        f"synthetic run: {args.steps} steps x {args.rollouts} rollouts, {size:,.0f} MiB of JSONL ({time.perf_counter() - t:.1f} s to write or reuse)"
    )

    port = _free_port()
    exe = Path(sys.executable).parent / "telescope"
    base = f"http://127.0.0.1:{port}"
    t_spawn = time.perf_counter()
    proc = subprocess.Popen([str(exe), "ui", str(args.dir), "--no-browser", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})  # fmt: skip
    try:
        while True:
            try:
                _get(base + "/api/poll")
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit("telescope ui exited early") from None
                time.sleep(0.02)
        t_up = time.perf_counter()
        runs = json.loads(_get(base + "/api/runs"))["runs"]
        key = runs[0]["key"]
        _get(f"{base}/api/runs/{key}/catalog")
        series = json.loads(_get(f"{base}/api/runs/{key}/metrics?keys=*"))
        t_metrics = time.perf_counter()
        mid = args.steps * 3 // 4
        rows = [
            ("server up (process start -> first answer)", t_up - t_spawn, "-"),
            ("Metrics page data, from process start", t_metrics - t_spawn, "<= 2 s"),
            ("Metrics page data, from first answer", t_metrics - t_up, "<= 2 s"),
            (f"  ({len(series['values'])} series x {len(series['step'])} steps)", None, ""),
            (f"Rollouts step {mid}, first request (block may be warming)", _timed(f"{base}/api/runs/{key}/rollouts?step={mid}")[0], "<= 0.3 s"),
            (f"Rollouts step {mid + 1}, warm", _timed(f"{base}/api/runs/{key}/rollouts?step={mid + 1}")[0], "<= 0.3 s"),
            (f"Rollouts step {mid + 2}, reward >= 0.5", _timed(f"{base}/api/runs/{key}/rollouts?step={mid + 2}&reward_min=0.5")[0], "<= 0.3 s"),
            (f"Rollouts step {mid}, one sample in full", _timed(f"{base}/api/runs/{key}/sample?step={mid}&group={mid * 1000}&sample=3")[0], "-"),
            (f"Timeline step {mid}, first request", _timed(f"{base}/api/runs/{key}/timeline?from={mid}&to={mid}")[0], "-"),
            (f"Timeline step {mid + 1}, warm", _timed(f"{base}/api/runs/{key}/timeline?from={mid + 1}&to={mid + 1}")[0], "-"),
        ]  # fmt: skip
        browser = _browser_first_chart(base)
        if browser is not None:
            rows.append(("Metrics page in chromium, load -> first chart drawn", browser, "<= 2 s"))
        rss, peak = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{'measure':58s} {'seconds':>9s}  target")
    for name, seconds, target in rows:
        print(f"{name:58s} {'' if seconds is None else f'{seconds:9.3f}'}  {target}")
    print(f"{'server memory: VmRSS now / VmHWM peak (MB)':58s} {rss:6.0f} / {peak:.0f}  <= 500 MB")


if __name__ == "__main__":
    main()
