"""Machine-wide claims between runs: port blocks and private Ray clusters (``runtime.claims``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ports import free_port_block

from telescope.core.cluster.claims import claim, claim_holder, port_block

HOLD = (
    "import sys, time\nfrom telescope.core.cluster.claims import claim\n"
    "held = claim(sys.argv[1], sys.argv[2], {'run_dir': '/runs/first'}); print('held', flush=True); time.sleep(120)"
)


def hold_in_other_process(kind: str, name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, kind, name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_port_in_use_moves_the_block_to_the_next_free_one() -> None:
    base = free_port_block(6)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 1))  # something else listens on the second port of the block
        busy.listen()
        first, claims = port_block("127.0.0.1", base, 2, {"run_dir": "x"})
    try:
        assert first == base + 2 and len(claims) == 2
    finally:
        for held in claims:
            held.release()


def test_a_port_another_live_run_claimed_is_skipped_though_nothing_listens_yet() -> None:
    base = free_port_block(4)
    other = hold_in_other_process("ports", str(base))
    try:
        first, claims = port_block("127.0.0.1", base, 2, {"run_dir": "second"})
        assert first == base + 2
        for held in claims:
            held.release()
    finally:
        other.kill()
        other.wait()
    first, claims = port_block("127.0.0.1", base, 2, {})  # the holder died: its claim went with it
    assert first == base
    for held in claims:
        held.release()


def test_a_private_cluster_is_seen_as_such_only_while_its_run_lives() -> None:
    address = f"10.9.8.7:{uuid.uuid4().int % 60000}"
    assert claim_holder("ray-clusters", address) is None
    other = hold_in_other_process("ray-clusters", address)
    try:
        holder = claim_holder("ray-clusters", address)
        assert holder == {"pid": other.pid, "run_dir": "/runs/first"}
        assert claim("ray-clusters", address, {}) is None  # nobody else can take it meanwhile
    finally:
        other.kill()
        other.wait()
    assert claim_holder("ray-clusters", address) is None


@pytest.mark.slow
def test_two_runs_reserve_their_pools_on_one_cluster() -> None:
    ray = pytest.importorskip("ray")
    from ray.util.placement_group import placement_group_table

    from telescope.core.runtime.cluster import reserve_pools
    from telescope.core.testing import make_config

    cfg = make_config(
        ray_inference_cpus_per_worker=0.1, ray_trainer_cpus_per_worker=0.1, trainer_num_workers=1
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        first = reserve_pools(cfg, 1, False, "run-one")
        second = reserve_pools(cfg, 1, False, "run-two")  # the same names without run ids were refused
        names = {
            placement_group_table(p)["name"]
            for p in (first.inference, first.trainer, second.inference, second.trainer)
        }
        assert names == {
            "telescope-inference-run-one",
            "telescope-trainer-run-one",
            "telescope-inference-run-two",
            "telescope-trainer-run-two",
        }
    finally:
        ray.shutdown()


def test_a_rendezvous_port_is_free_below_the_ephemeral_range_and_unclaimed(
    own_claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telescope.core.cluster.claims as claims

    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {claims.rendezvous_port("127.0.0.1") for _ in range(20)}
    assert all(20000 <= p < low for p in ports)
    # The first picks are a claimed port and a busy one: both are skipped.
    base = free_port_block(3)
    other = hold_in_other_process("ports", str(base))
    picks = iter([base, base + 1, base + 2])
    monkeypatch.setattr(claims.random, "randrange", lambda lo, hi: next(picks))
    try:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", base + 1))
            busy.listen()
            assert claims.rendezvous_port("127.0.0.1") == base + 2
    finally:
        other.kill()
        other.wait()


PICK = (
    "import random, sys\nfrom telescope.core.cluster.claims import rendezvous_port\n"
    "random.seed(7)\nprint(rendezvous_port('127.0.0.1'), flush=True)\nsys.stdin.read()"
)


def pick_in_other_process() -> tuple[subprocess.Popen[str], int]:
    """A process that picks a rendezvous port (the same first candidate every time: seeded) and lives on."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PICK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


@pytest.fixture
def own_claims_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Claims under tmp_path (this process's and its children's): other runs on this machine neither
    see nor disturb the test's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_two_runs_picking_rendezvous_ports_at_once_get_different_ports(own_claims_dir: Path) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        with ThreadPoolExecutor(3) as pool:  # started together; each holds its port while it lives
            picks = list(pool.map(lambda _: pick_in_other_process(), range(3)))
        procs = [proc for proc, _ in picks]
        ports = [port for _, port in picks]
        assert len(set(ports)) == 3, f"two live runs were given the same port: {ports}"
    finally:
        for proc in procs:
            end(proc)


def test_a_rendezvous_claim_of_a_dead_run_is_taken_over_and_a_live_one_is_not(
    own_claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telescope.core.cluster.claims as claims

    proc, port = pick_in_other_process()
    # a neighbour that is free now (one taken by another process would be skipped too)
    other = next(p for p in range(port + 1, claims._ephemeral_low()) if claims.port_free("127.0.0.1", p))
    picks = iter([port, other, port])
    monkeypatch.setattr(claims.random, "randrange", lambda lo, hi: next(picks))
    try:
        assert claims.rendezvous_port("127.0.0.1") == other  # the live run's port is skipped
    finally:
        end(proc)
    assert claims.rendezvous_port("127.0.0.1") == port  # its run died: the claim is taken over
    assert claims.release_rendezvous_ports() == sorted([port, other])  # this run's end removes both
    assert not list(claims.claims_dir("rendezvous").glob("*.claim"))


def test_a_rendezvous_claim_from_another_machine_holds_for_its_lease(
    own_claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telescope.core.cluster.claims as claims

    port = claims.rendezvous_port("127.0.0.1", owner={"pid": 1, "host": "another-node"})
    (claim_file,) = claims.claims_dir("rendezvous").glob("*.claim")
    assert json.loads(claim_file.read_text())["host"] == "another-node"
    assert claims.release_rendezvous_ports() == []  # not this process's claim
    monkeypatch.setattr(claims.random, "randrange", lambda lo, hi: port)
    assert claims.rendezvous_port("127.0.0.1", tries=3) != port  # pid 1 elsewhere cannot be checked: held
    aged = {**json.loads(claim_file.read_text()), "time": time.time() - claims.RENDEZVOUS_LEASE_S - 1}
    claim_file.write_text(json.dumps(aged))
    assert claims.rendezvous_port("127.0.0.1", tries=3) == port  # past its lease: taken over


def test_an_inference_port_block_skips_a_port_claimed_for_a_store(own_claims_dir: Path) -> None:
    import telescope.core.cluster.claims as claims

    base = free_port_block(4)
    # a live run (this process) picked base+1 for its store and has not bound it yet
    assert claims._claim_port(base + 1, {"pid": os.getpid(), "host": socket.gethostname()})
    first, held = port_block("127.0.0.1", base, 2, {"run_dir": "x"})
    assert first == base + 2
    for h in held:
        h.release()
    claims.release_rendezvous_ports()
    first, held = port_block("127.0.0.1", base, 2, {"run_dir": "x"})  # released: the block is free again
    assert first == base
    for h in held:
        h.release()


def test_a_rendezvous_claim_with_a_bad_pid_is_stale_not_an_error(own_claims_dir: Path) -> None:
    import telescope.core.cluster.claims as claims

    path = claims.claims_dir("rendezvous") / "25000.claim"
    path.write_text(json.dumps({"pid": "x", "host": socket.gethostname(), "time": time.time()}))
    assert claims._stale(path)
    assert claims._claim_port(25000, {"pid": os.getpid(), "host": socket.gethostname()})
    claims.release_rendezvous_ports()


# --- the claims folder is private (a shared /tmp must not let another user redirect a run's writes) ---


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $TMPDIR for the claims folder; returns the folder claims.py will use."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / f"telescope-{os.getuid()}"


def test_the_claims_folder_is_created_private(private_tmp: Path) -> None:
    held = claim("ports", "7001", {})
    assert held is not None
    held.release()
    for folder in (private_tmp, private_tmp / "ports"):
        assert (folder.stat().st_mode & 0o777) == 0o700
    assert ((private_tmp / "ports" / "7001.lock").stat().st_mode & 0o077) == 0


def test_a_planted_symlink_is_refused_and_its_target_left_intact(private_tmp: Path, tmp_path: Path) -> None:
    from telescope.core.cluster.claims import ClaimsDirError

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (private_tmp / "ports").mkdir(parents=True)
    (private_tmp / "ports" / "7002.lock").symlink_to(victim)
    with pytest.raises(ClaimsDirError, match="7002.lock is a symlink"):
        claim("ports", "7002", {"run_dir": "x"})
    with pytest.raises(ClaimsDirError, match="symlink"):
        claim_holder("ports", "7002")
    assert victim.read_text() == "precious"


def test_a_claims_folder_that_is_a_symlink_is_refused(private_tmp: Path, tmp_path: Path) -> None:
    from telescope.core.cluster.claims import ClaimsDirError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    private_tmp.symlink_to(elsewhere)
    with pytest.raises(ClaimsDirError, match="is not a folder"):
        claim("ports", "7003", {})
    assert list(elsewhere.iterdir()) == []


def test_an_existing_loose_claims_folder_of_ours_is_made_private(private_tmp: Path) -> None:
    private_tmp.mkdir(mode=0o777)
    os.chmod(private_tmp, 0o777)
    held = claim("ports", "7004", {})
    assert held is not None
    held.release()
    assert (private_tmp.stat().st_mode & 0o777) == 0o700
