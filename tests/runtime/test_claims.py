"""Machine-wide claims between runs: port blocks and private Ray clusters (``runtime.claims``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import pytest
from ports import free_port_block

from telescope.core.runtime.claims import claim, claim_holder, port_block

HOLD = (
    "import sys, time\nfrom telescope.core.runtime.claims import claim\n"
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
        names = {placement_group_table(p)["name"] for p in (first.inference, first.trainer, second.inference,
                                                                second.trainer)}  # fmt: skip
        assert names == {"telescope-inference-run-one", "telescope-trainer-run-one",
                         "telescope-inference-run-two", "telescope-trainer-run-two"}  # fmt: skip
    finally:
        ray.shutdown()


def test_a_rendezvous_port_is_free_below_the_ephemeral_range_and_unclaimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import telescope.core.runtime.claims as claims

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
