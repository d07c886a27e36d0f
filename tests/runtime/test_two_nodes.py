"""A two-node Ray cluster on one machine: a head raylet and a worker raylet at 127.0.0.2.

Ray reports the head at this machine's own address (it resolves a 127.0.0.1 head to a
reachable one), the worker at 127.0.0.2: two distinct node addresses, each with its own CPU
count and custom resource. An end-to-end run places the inference server on the worker node
(1.5 CPUs fit only there) and the trainer on the head: the driver must use the server node's
address, not 127.0.0.1, and the weight sync must cross nodes. Then PACK / SPREAD / STRICT_*
placements are checked bundle by bundle. Marked slow (about 2-3 minutes on 2 cores).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block

from telescope.core.testing import smallest_run_settings

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

WORKER_IP = "127.0.0.2"
HEAD_CPUS, WORKER_CPUS = 1, 2


def _ray_start(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``ray start --block`` in its own process group (ended by group id at teardown)."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    return subprocess.Popen(
        [ray_bin, "start", "--block", "--disable-usage-stats", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _wait_for_nodes(address: str, count: int, timeout_s: float = 90.0) -> None:
    probe = "import ray,sys; ray.init(address=sys.argv[1]); print(sum(n['Alive'] for n in ray.nodes()))"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=60
        )
        if out.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(2)
    raise RuntimeError(f"the two-node cluster at {address} did not come up")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Address of a fresh head + worker cluster (own temp dir and ports; never `ray stop`)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    temp = tempfile.mkdtemp(prefix="tg2n", dir="/tmp")  # short: Ray's socket paths have a length limit
    base = free_port_block(6)
    address = f"127.0.0.1:{base}"
    head = _ray_start(
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={base}",
        f"--num-cpus={HEAD_CPUS}",
        '--resources={"head_node": 1}',
        "--include-dashboard=false",
        f"--temp-dir={temp}",
        f"--ray-client-server-port={base + 1}",
        f"--dashboard-agent-listen-port={base + 2}",
        f"--metrics-export-port={base + 3}",
        env=env,
    )
    procs = [head]
    try:
        _wait_for_nodes(address, 1)
        procs.append(
            _ray_start(
                f"--address={address}",
                f"--node-ip-address={WORKER_IP}",
                f"--num-cpus={WORKER_CPUS}",
                '--resources={"worker_node": 1}',
                f"--dashboard-agent-listen-port={base + 4}",
                f"--metrics-export-port={base + 5}",
                env=env,
            )
        )
        _wait_for_nodes(address, 2)
        os.environ["RAY_AUTH_MODE"] = "disabled"
        yield address
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


# The run, in a process of its own: a driver that already had an in-process Ray session (an earlier
# test of the same pytest process) could not start its actors on this cluster ("cancelled before it
# started running"). Records what ``start_servers`` returned and where the trainer ranks were placed.
RUN_ON_CLUSTER = """
import json, sys
import telescope.core.runtime.ray_group as ray_group
from telescope.core.config import load_config
from telescope.core.plugins import load_plugins
from telescope.core.runtime import run_training

settings, out = json.loads(sys.argv[1]), sys.argv[2]
seen = {}
real_start_servers, real_start_trainers = ray_group.start_servers, ray_group.start_trainers

def recording_start_servers(*args, **kwargs):
    servers = real_start_servers(*args, **kwargs)
    seen["urls"], seen["node_ips"] = servers.urls, servers.node_ips
    return servers

def recording_start_trainers(cfg_data, plugins, pools, world_size, cpus):
    seen["trainer_nodes"] = [ray_group.bundle_ip(pools.trainer, r) for r in range(world_size)]
    return real_start_trainers(cfg_data, plugins, pools, world_size, cpus)

ray_group.start_servers, ray_group.start_trainers = recording_start_servers, recording_start_trainers
pset, registry = load_plugins()
seen["code"] = run_training(load_config(None, settings, registry), pset, registry)
with open(out, "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture(scope="module")
def run(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A two-step run on the cluster; what the driver saw (server URLs and nodes, trainer nodes)."""
    import json

    folder = tmp_path_factory.mktemp("two-nodes")
    run_dir, out, log = folder / "run", folder / "seen.json", folder / "driver.log"
    settings = smallest_run_settings(
        inference_host="0.0.0.0",
        ray_inference_cpus_per_worker=1.5,
        ray_trainer_cpus_per_worker=1.0,
        ray_address=cluster,
        ray_auto_start_local=False,
        ray_shutdown_on_exit=False,
        enable_vllm_tracing=False,
        inference_base_port=free_port_block(1),
        number_of_steps=2,
        max_async_rollout=0,
        seq_len=512,
        run_dir=str(run_dir),
        seed=3,
    )
    with log.open("wb") as sink:
        driver = subprocess.run(
            [sys.executable, "-c", RUN_ON_CLUSTER, json.dumps(settings), str(out)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=480,
        )
    assert driver.returncode == 0 and out.is_file(), f"the driver failed:\n{log.read_text()[-4000:]}"
    return {**json.loads(out.read_text()), "run_dir": run_dir}


def test_driver_reaches_the_server_on_the_other_node_at_its_address(run: dict[str, Any]) -> None:
    print(f"server node {run['node_ips']}, trainer node {run['trainer_nodes']}, driver used {run['urls']}")
    assert run["code"] == 0
    assert run["node_ips"] == [WORKER_IP] and run["trainer_nodes"][0] != WORKER_IP
    assert run["urls"][0].startswith(f"http://{WORKER_IP}:")  # not the server's own 127.0.0.1


def test_weights_crossed_nodes_every_step(run: dict[str, Any]) -> None:
    from telescope.core.observe import RunDirReader

    syncs = [
        e for e in RunDirReader(run["run_dir"]).events() if e["type"] == "weight_sync" and e["phase"] == "end"
    ]
    assert len(syncs) == 2 and len({e["attrs"]["digest"] for e in syncs}) == 2


def _wait_until_every_cpu_is_free(timeout_s: float = 120.0) -> None:
    """Wait for the reservations of earlier tests (the run's pools, removed by Ray once its driver has
    gone; the previous strategy's groups) to be released: STRICT_SPREAD needs the head's only CPU,
    and on a loaded 2-core machine Ray has taken longer than a placement timeout to free it."""
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < total:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the cluster's CPUs were not released in {timeout_s:.0f}s: {ray.available_resources()} "
                f"available of {ray.cluster_resources()}"
            )
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("strategy", "cpus", "expected"),
    [
        ("STRICT_PACK", 1.0, "one node"),  # 2 x 1 CPU: only the worker node holds both
        ("PACK", 1.0, "one node"),
        # not 1 CPU: the head has only 1, and the trainer's 0.01-CPU bundle may be placed there first
        ("STRICT_SPREAD", 0.5, "two nodes"),
        ("SPREAD", 0.5, "two nodes"),
    ],
)
def test_placement_strategies(cluster: str, strategy: str, cpus: float, expected: str) -> None:
    import ray

    from telescope.core.runtime.cluster import reserve_pools, shutdown
    from telescope.core.runtime.ray_group import bundle_ip
    from telescope.core.testing import make_config

    cfg = make_config(
        ray_inference_placement_strategy=strategy,
        ray_trainer_placement_strategy=strategy,
        ray_inference_cpus_per_worker=cpus,
        ray_trainer_cpus_per_worker=0.01,
        trainer_num_workers=1,
        inference_num_workers=2,
        ray_placement_timeout_s=30,
        ray_namespace=f"placement-{strategy}",
    )
    ray.init(address=cluster)
    pools = None
    try:
        _wait_until_every_cpu_is_free()
        pools = reserve_pools(cfg, 2, use_gpus=False)
        nodes = [bundle_ip(pools.inference, i) for i in range(2)]
    finally:
        shutdown(cfg, pools, started_here=False)
    print(f"{strategy}: bundles on {nodes}")
    assert (len(set(nodes)) == 1) == (expected == "one node"), nodes
    if strategy == "STRICT_PACK":
        assert nodes == [WORKER_IP, WORKER_IP]
