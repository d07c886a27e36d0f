"""The ``telescope ui`` server's JSON endpoints and static files, over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ui_runs import step_rows, write_run

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.server import ServerThread, plotly_js_path
from telescope.core.cluster.addresses import is_loopback


def _get(srv: ServerThread, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(srv.url + path, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_endpoints(server: ServerThread) -> None:
    status, body = _get(server, "/api/runs")
    runs = json.loads(body)["runs"]
    assert status == 200 and [r["key"] for r in runs] == ["one"] and runs[0]["step"] == 3
    series = json.loads(_get(server, "/api/runs/one/metrics?keys=*")[1])
    assert series["step"] == [1, 2, 3] and series["values"]["entropy"] == pytest.approx([1, 0.5, 1 / 3])
    got = json.loads(_get(server, "/api/runs/one/rollouts?step=2&reward_min=0.5")[1])
    assert got["matched"] == sum(1 for r in step_rows(2) if r.reward >= 0.5) and got["steps"] == [1, 2, 3]
    one = json.loads(_get(server, "/api/runs/one/sample?step=2&group=0&sample=1")[1])
    assert one["record"]["sample_id"] == 1
    assert [m["role"] for m in one["conversation"]] == ["user", "assistant"]
    assert [p["kind"] for p in one["conversation"][1]["parts"]] == ["text", "tool_call"]
    assert json.loads(_get(server, "/api/poll")[1])["runs"]["one"]["step"] == 3
    assert len(json.loads(_get(server, "/api/runs/one/timeline?from=1&to=3")[1])["spans"]) > 0


def test_errors_name_the_problem(server: ServerThread) -> None:
    status, body = _get(server, "/api/runs/one/rollouts?step=abc")
    assert status == 400 and "step='abc' is not an integer" in json.loads(body)["error"]
    status, body = _get(server, "/api/runs/nope/metrics")
    assert status == 404 and "no run 'nope'" in json.loads(body)["error"]
    status, body = _get(server, "/api/runs/one/sample?step=2")
    assert status == 400 and "needs step, group and sample" in json.loads(body)["error"]


def test_static_page_and_local_plotly(server: ServerThread) -> None:
    status, body = _get(server, "/")
    assert status == 200 and b'href="/vendor/plotly.min.js"' in body and b"http" not in body
    assert _get(server, "/static/app.js")[0] == 200
    if plotly_js_path() is not None:
        status, body = _get(server, "/vendor/plotly.min.js")
        assert status == 200 and len(body) > 1_000_000


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")


def test_background_warming_indexes_every_block(tmp_path: Path) -> None:
    import threading

    from telescope.cli.ui.server import warm_indexes

    write_run(tmp_path / "run", steps=3)
    ws = Workspace([tmp_path / "run"])
    warm_indexes(ws, threading.Lock(), threading.Event(), delay_s=0)
    run = ws.runs()[0]
    indexes = run.rollouts.all_indexes() + run.events.all_indexes()
    assert indexes and all(len(i) > 0 and not i.pending() for i in indexes)
    assert run.rollouts.all_indexes()[0].step_numbers() == [1, 2, 3]


def test_warming_ends_at_a_torn_last_line(tmp_path: Path) -> None:
    import threading

    from telescope.cli.ui.server import warm_indexes

    write_run(tmp_path / "run", steps=3)
    ws = Workspace([tmp_path / "run"])
    run = ws.runs()[0]
    first = run.rollouts.all_indexes()[0].path
    with open(first, "a") as f:
        f.write('{"step": 4, "unfinis')  # the run was killed in the middle of a write
    warm = threading.Thread(
        target=warm_indexes, args=(ws, threading.Lock(), threading.Event()), kwargs={"delay_s": 0}
    )
    warm.start()
    warm.join(10)
    assert not warm.is_alive(), "warming spun on the torn line"
    assert run.rollouts.all_indexes()[0].step_numbers() == [1, 2, 3]
    assert all(len(i) > 0 for i in run.events.all_indexes())  # the files after it were indexed too


def test_warming_waits_while_requests_are_in_flight(tmp_path: Path) -> None:
    import threading
    import time

    from telescope.cli.ui.server import Activity, warm_indexes

    write_run(tmp_path / "run", steps=3)
    ws = Workspace([tmp_path / "run"])
    activity, stop = Activity(), threading.Event()
    activity.enter()  # a page's request in flight
    warm = threading.Thread(
        target=warm_indexes, args=(ws, threading.Lock(), stop), kwargs={"delay_s": 0, "activity": activity}
    )
    warm.start()
    time.sleep(0.5)
    assert all(len(i) == 0 for i in ws.runs()[0].rollouts.all_indexes())  # nothing indexed meanwhile
    activity.leave()
    warm.join(10)
    assert not warm.is_alive()
    assert ws.runs()[0].rollouts.all_indexes()[0].step_numbers() == [1, 2, 3]


def test_a_line_longer_than_the_read_limit_is_read_whole(tmp_path: Path) -> None:
    from telescope.cli.ui.index import StepIndex

    path = tmp_path / "block.jsonl"
    lines = [json.dumps({"step": s, "text": "x" * n}) for s, n in ((1, 10), (2, 5000), (3, 10))]
    path.write_text("".join(line + "\n" for line in lines))
    index = StepIndex(path)
    for _ in range(20):  # 1 KiB reads: the 5 kB line is read on to its end, not skipped or stuck
        index.refresh(max_chunks=1, chunk_bytes=1024)
    assert index.step_numbers() == [1, 2, 3]
    assert list(index.lengths) == [len(line) for line in lines]  # without the newline


def test_telescope_ui_command_serves_and_warns_on_public_host(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    write_run(tmp_path / "runs" / "one", steps=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "telescope"
    proc = subprocess.Popen(
        [str(exe), "ui", str(tmp_path / "runs"), "--no-browser", "--port", str(port), "--host", "0.0.0.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 60, b""
        while time.monotonic() < deadline and not body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5) as resp:
                    body = resp.read()
            except OSError:
                time.sleep(0.2)
        assert [r["key"] for r in json.loads(body)["runs"]] == ["one"]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert "no authentication" in err and f":{port}/" in out
    missing = subprocess.run(
        [str(exe), "ui", str(tmp_path / "nope"), "--no-browser"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no such folder" in missing.stderr


def _send(srv: ServerThread, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(srv.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_layout_routes_over_http(server: ServerThread, tmp_path: Path) -> None:
    body = json.dumps({"sections": [{"name": "s", "keys": ["entropy"]}]}).encode()
    # a form post (what a foreign web page can send without asking) is refused
    status, answer = _send(
        server, "PUT", "/api/layout", body, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 415 and not (tmp_path / "runs" / ".telescope-ui").exists()
    status, answer = _send(server, "PUT", "/api/layout", body, {"Content-Type": "application/json"})
    assert status == 200 and answer["sections"] == [{"name": "s", "keys": ["entropy"]}]
    with urllib.request.urlopen(server.url + "/api/layout", timeout=10) as resp:
        assert json.loads(resp.read())["sections"] == [{"name": "s", "keys": ["entropy"]}]
    status, answer = _send(
        server, "POST", "/api/layout/export", b'{"name": "../../x"}', {"Content-Type": "application/json"}
    )
    assert status == 400 and "'../../x' is not a plain name" in answer["error"]
    status, answer = _send(server, "PUT", "/api/layout", b"not json", {"Content-Type": "application/json"})
    assert status == 400 and "not JSON" in answer["error"]
