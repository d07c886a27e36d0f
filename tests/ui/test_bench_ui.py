"""bench/ui.py waits for its ``telescope ui`` server with a deadline: a server that never
answers, or exits, stops the benchmark with the URL, the time waited, the exit code and the
server's last output lines instead of hanging it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def _spawn(code: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_never_answers_is_killed_at_the_deadline(
    tmp_path: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    bench, log = bench_script("ui"), tmp_path / "server.log"
    proc = _spawn("import time; print('loading the run', flush=True); time.sleep(60)", log)
    url = f"http://127.0.0.1:{_port()}/api/poll"
    t = time.perf_counter()
    with pytest.raises(SystemExit) as err:
        bench._wait_for_server(proc, url, log, deadline_s=1.0)
    assert time.perf_counter() - t < 15
    msg = str(err.value)
    waited = re.search(r"still running after (\d+\.\d+) ?s", msg)  # a loaded machine may overshoot
    assert url in msg and waited and float(waited.group(1)) >= 1.0 and "killed" in msg
    assert "loading the run" in msg and str(log) in msg
    assert proc.poll() is not None  # killed, not left behind


def test_a_server_that_exits_names_its_exit_code_and_output(
    tmp_path: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    bench, log = bench_script("ui"), tmp_path / "server.log"
    proc = _spawn("import sys; print('OSError: address already in use'); sys.exit(3)", log)
    with pytest.raises(SystemExit) as err:
        bench._wait_for_server(proc, f"http://127.0.0.1:{_port()}/api/poll", log, deadline_s=30.0)
    msg = str(err.value)
    assert "exited with code 3" in msg and "address already in use" in msg


def test_a_server_that_comes_up_late_is_waited_for(
    tmp_path: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    bench, log, port = bench_script("ui"), tmp_path / "server.log", _port()
    proc = _spawn(
        "import time, http.server; time.sleep(0.5); "
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()",
        log,
    )
    try:
        bench._wait_for_server(proc, f"http://127.0.0.1:{port}/", log, deadline_s=30.0)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
