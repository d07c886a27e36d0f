"""The private Ray cluster a run starts refuses unauthenticated jobs (security finding #1 of the
closed-by-default issue: a plain HTTP POST to the dashboard agent's job API ran commands as the
run's user)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

PROBE = textwrap.dedent("""
    import http.client, json, os, sys, time, urllib.error, urllib.request
    from telescope.core.config import load_config
    from telescope.core.runtime.cluster import connect
    import ray

    cfg = load_config(None, {"environments": [{"name": "reverse_text"}], "ray_address": "local", "ray_log_to_driver": False})
    connect(cfg, sys.argv[1])
    node = ray._private.worker._global_node

    def listening_ports(pids):
        # TCP ports the processes pids listen on (their socket inodes in /proc/net/tcp)
        inodes = set()
        for pid in pids:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].split(":")[1], 16))
        return ports

    raylets = {str(proc.process.pid) for proc in node.all_processes.get("raylet", [])}

    def agents():
        # Ray's agents of this cluster: children of its raylet (their titles are rewritten)
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] in raylets:
                found.append(pid)
        return found

    def post_job(port):
        # the HTTP status of submitting a job on port, or None when the port does not speak HTTP
        body = json.dumps({"entrypoint": f"touch {sys.argv[2]}", "submission_id": f"probe-{port}"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/job_agent/jobs/", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, http.client.HTTPException):
            return None  # gRPC, or not on loopback

    deadline, statuses = time.time() + 60, {}
    while time.time() < deadline and not any(code in (200, 401) for code in statuses.values()):
        time.sleep(1)  # the agent's job API comes up several seconds after the cluster
        statuses = {port: post_job(port) for port in sorted(listening_ports(agents()))}
        statuses = {port: code for port, code in statuses.items() if code is not None}
    @ray.remote
    def task():
        return os.getpid()
    ray.get(task.remote())  # the run's own workers still authenticate
    time.sleep(2)
    print(json.dumps({"statuses": statuses, "mode": os.environ.get("RAY_AUTH_MODE")}))
    ray.shutdown()
""")


@pytest.mark.slow
def test_the_private_cluster_refuses_an_unauthenticated_job(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "run"), str(marker)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["mode"] == "token"
    assert 401 in seen["statuses"].values() and 200 not in seen["statuses"].values(), seen
    assert not marker.exists()
