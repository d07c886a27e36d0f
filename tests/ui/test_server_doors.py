"""The dashboard answers only requests that name it and serves only the run's own files (finding 8 of
the closed-by-default issue: a ``logs/x.log`` symlink served an outside file, and any Host header was
answered, so a rebound DNS name let a web page read every run)."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

import pytest
from ui_runs import write_run

from telescope.cli.ui.data import Workspace
from telescope.cli.ui.server import ServerThread

OUTSIDE = "SECRET-OUTSIDE-THE-RUN"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every run, holding files a symlink in a run could point at."""
    folder = tmp_path / "private"
    folder.mkdir()
    (folder / "notes.log").write_text(f"2026-01-01 00:00:00 INFO {OUTSIDE}\n")
    (folder / "config.yaml").write_text(f"model: {OUTSIDE}\n")
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "metrics": {OUTSIDE: 1.0}}) + "\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.log").write_text(f"2026-01-01 00:00:00 INFO {OUTSIDE} deep\n")
    return folder


def get(srv: ServerThread, path: str, host: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{srv.port}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


ROUTES = [
    "/",
    "/static/app.js",
    "/vendor/plotly.min.js",
    "/api/runs",
    "/api/poll",
    "/api/layout",
    "/api/runs/one/config",
    "/api/runs/one/metrics?keys=*",
    "/api/runs/one/logs",
    "/api/runs/one/rollouts?step=1",
    "/api/runs/one/timeline?from=1&to=2",
    "/api/runs/one/system",
]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", ""])
def test_every_route_refuses_a_foreign_host(server: ServerThread, path: str, host: str) -> None:
    """DNS rebinding: the page of evil.example, its name now resolving to 127.0.0.1, sends its own Host."""
    status, body = get(server, path, host)
    assert status == 421, body
    assert "Host" in body and "one" not in body.replace("one of", "")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]:1", "192.168.1.4:8080"])
def test_this_machines_names_and_addresses_are_answered(server: ServerThread, host: str) -> None:
    status, body = get(server, "/api/runs", host)
    assert status == 200 and [r["key"] for r in json.loads(body)["runs"]] == ["one"]


def test_a_log_symlinked_out_of_the_run_is_not_served(
    server: ServerThread, tmp_path: Path, outside: Path
) -> None:
    run = tmp_path / "runs" / "one"
    (run / "logs" / "x.log").symlink_to(outside / "notes.log")
    (run / "logs" / "linked").symlink_to(outside / "sub", target_is_directory=True)
    (run / "logs" / "inside.log").symlink_to(run / "logs" / "telescope.log")  # inside: fine
    status, body = get(server, "/api/runs/one/logs?limit=5000")
    assert status == 200 and OUTSIDE not in body
    files = {e["file"] for e in json.loads(body)["entries"]}
    assert "x.log" not in files and not any(f.startswith("linked/") for f in files)
    assert "telescope.log" in files


@pytest.mark.parametrize(("name", "route"), [("config.yaml", "config"), ("metrics.jsonl", "metrics?keys=*")])
def test_run_files_symlinked_out_of_the_run_are_refused(
    tmp_path: Path, outside: Path, name: str, route: str
) -> None:
    run = tmp_path / "runs" / "one"
    write_run(run, steps=2)
    (run / name).unlink()
    (run / name).symlink_to(outside / name)
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        status, body = get(srv, f"/api/runs/one/{route}")
    finally:
        srv.stop()
    assert OUTSIDE not in body
    assert status == 400 and "outside the run directory" in body and name in body


def test_a_run_whose_run_json_points_outside_is_not_listed(tmp_path: Path, outside: Path) -> None:
    run = tmp_path / "runs" / "one"
    write_run(run, steps=1)
    (outside / "run.json").write_text((run / "run.json").read_text().replace('"one"', f'"{OUTSIDE}"'))
    os.replace(run / "run.json", tmp_path / "moved.json")
    (run / "run.json").symlink_to(outside / "run.json")
    srv = ServerThread(Workspace([tmp_path / "runs"])).start()
    try:
        status, body = get(srv, "/api/runs")
    finally:
        srv.stop()
    assert status == 200 and json.loads(body)["runs"] == []
    assert "outside the run directory" in json.dumps(json.loads(body)["errors"])
