"""Faults on the real runtime (Ray, transformers server, FSDP on gloo, the real run directory).

The trainer failure runs by default; the others are marked slow (each also has a fast test
with fakes in test_liveness.py). Each run is injected a fault through ``TELESCOPE_FAULTS`` (``telescope.core.faults``),
which reaches the Ray workers through the run's runtime_env. A hang shows as a pytest timeout.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block
from test_resume_e2e import read_jsonl, settings

from telescope.core.config import load_config
from telescope.core.observe import RunDirReader
from telescope.core.plugins import load_plugins

pytest.importorskip("ray")


def train(run_dir: Path, **overrides: Any) -> float:
    """Run to the end (or the failure); returns the seconds the run took."""
    from telescope.core.runtime import run_training

    pset, registry = load_plugins()
    cfg = load_config(None, settings(run_dir, **overrides), registry)
    start = time.time()
    try:
        run_training(cfg, pset, registry)
    finally:
        elapsed = time.time() - start
    return elapsed


def steps(run_dir: Path) -> list[dict[str, float]]:
    return [row.get("metrics", row) | {"step": row["step"]} for row in read_jsonl(run_dir / "metrics.jsonl")]


def status(run_dir: Path) -> str:
    return str(json.loads((run_dir / "run.json").read_text())["status"])


def finished_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, number_of_steps: int, **overrides: Any
) -> tuple[Path, list[dict[str, float]]]:
    """A run with faults ``spec`` that must finish every step; its run directory and step metrics."""
    monkeypatch.setenv("TELESCOPE_FAULTS", spec)
    run_dir = tmp_path / "run"
    train(run_dir, number_of_steps=number_of_steps, **overrides)
    metrics = steps(run_dir)
    assert [int(m["step"]) for m in metrics] == list(range(1, number_of_steps + 1))
    assert status(run_dir) == "finished"
    return run_dir, metrics


@pytest.mark.timeout(240)
def test_a_trainer_that_raises_at_step_3_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.core.errors import RunStageError

    monkeypatch.setenv("TELESCOPE_FAULTS", "train_step_raise@3")  # raised in the Ray trainer actor
    with pytest.raises(RunStageError) as info:
        train(tmp_path / "run", number_of_steps=8, max_async_rollout=0)
    message = str(info.value)
    assert message.startswith(
        "step 3: train_step failed: InjectedFault: TELESCOPE_FAULTS: train_step_raise@3"
    )
    assert [int(s["step"]) for s in steps(tmp_path / "run")] == [1, 2]
    assert status(tmp_path / "run") == "failed"


@pytest.mark.slow  # the same code path is covered without Ray in test_liveness.py
@pytest.mark.timeout(240)
def test_a_prompt_failing_to_prepare_in_the_prefetch_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.core.errors import RunStageError

    monkeypatch.setenv("TELESCOPE_FAULTS", "prompt_raise@40")  # long after the 24-prompt buffer first filled
    with pytest.raises(RunStageError) as info:
        train(tmp_path / "run", number_of_steps=40, enable_prompt_prefetch=True)
    assert str(info.value).startswith("prompt preparation (environment 'reverse_text', sample ")
    assert "InjectedFault: TELESCOPE_FAULTS: prompt_raise@40" in str(info.value)
    assert 0 < len(steps(tmp_path / "run")) < 40 and status(tmp_path / "run") == "failed"


@pytest.mark.slow  # ~50 s: 200 failed groups in a row end the run; test_liveness.py has the fast version
@pytest.mark.timeout(300)
def test_failed_requests_are_counted_and_a_reward_that_always_raises_stops_the_run_naming_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.core.runtime.supervision.stall import RolloutsFailingError

    monkeypatch.setenv("TELESCOPE_FAULTS", "request_fail=0.1,reward_raise=countdown")
    run_dir = tmp_path / "run"
    envs = [{"name": "reverse_text", "weight": 1.0}, {"name": "countdown", "weight": 4.0}]
    with pytest.raises(RolloutsFailingError) as info:
        train(
            run_dir, environments=envs, number_of_steps=500, group_size=2, max_tokens=4, max_async_rollout=2
        )
    message = str(info.value)
    assert "prompt groups of environment 'countdown' produced a usable rollout" in message
    assert "reward_error" in message and "TELESCOPE_FAULTS: reward_raise=countdown" in message
    rows = RunDirReader(run_dir).rollouts()
    trained = [r for r in rows if r["kept"]]
    assert trained and {r["env"] for r in trained} == {"reverse_text"}  # the healthy environment trained
    failed = [r for r in rows if r["discard_reason"] == "rollout_error"]
    assert failed and any(r["stop_reason"] == "error" for r in failed)
    metrics = steps(run_dir)
    assert sum(m["discarded/rollout_error/count"] for m in metrics) == len(failed)
    assert sum(m["discarded/reward_error/count"] for m in metrics) == sum(
        r["discard_reason"] == "reward_error" for r in rows if r["step"] <= len(metrics)
    )
    assert sum(m.get("reward/countdown/errors", 0) for m in metrics) > 0
    assert status(run_dir) == "failed"
    log = (run_dir / "logs" / "telescope.log").read_text()
    assert log.count("environment 'countdown': reward function 'compute_reward' failed") == 1
    assert "Traceback" in log


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_where_one_request_in_ten_fails_finishes_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, metrics = finished_run(tmp_path, monkeypatch, "request_fail=0.1", 6, max_async_rollout=1)
    rows = RunDirReader(run_dir).rollouts()
    failed = [r for r in rows if r["stop_reason"] == "error"]
    assert failed and all(r["discard_reason"] == "rollout_error" for r in failed)
    assert metrics[-1]["totals/rollout_errors"] >= len([r for r in failed if r["step"] <= 6])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_server_killed_at_step_5_is_restarted_and_the_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGKILL of the whole server process group once step 5 ended; a checkpoint at the last step
    # holds the prompts drawn but not trained yet (the ledger a resume would serve first). No
    # prefetch: a re-queued prompt is then served before any new one (with prefetch, after the
    # prompts already prefetched), so it must be trained within these 8 steps.
    run_dir, metrics = finished_run(
        tmp_path,
        monkeypatch,
        "server_kill@5",
        8,
        max_async_rollout=1,
        checkpoint_every=8,
        enable_prompt_prefetch=False,
    )
    assert metrics[-1]["faults/inference_restarts"] == 1.0
    rows = RunDirReader(run_dir).rollouts()
    kept = [(r["step"], r["group_id"], r["sample_id"]) for r in rows if r["kept"]]
    groups_by_step: dict[int, set[int]] = {}
    for step, gid, _ in kept:
        groups_by_step.setdefault(step, set()).add(gid)
    trained = [gid for gids in groups_by_step.values() for gid in gids]
    assert len(trained) == len(set(trained)) == 8 * 2, "a group was trained twice, or a step lacks one"
    assert len(kept) == len(set(kept))
    # Nothing lost: every prompt drawn (group ids 0 .. next_group_id - 1) was trained, discarded with a
    # record, or is still outstanding; the groups in flight on the killed server were re-queued.
    state = json.loads((run_dir / "checkpoints" / "step_8" / "orchestrator_state.json").read_text())
    outstanding = {int(item["group_id"]) for item in state["prompts"]["outstanding"]}
    discarded = {int(r["group_id"]) for r in rows if r["discard_reason"] is not None}
    drawn = int(state["prompts"]["scheduler"]["next_group_id"])
    assert set(range(drawn)) == set(trained) | discarded | outstanding, "a drawn prompt was lost"
    assert outstanding == set(), "a re-queued prompt was not served again"
    log = (run_dir / "logs" / "telescope.log").read_text()
    died = re.search(
        r"inference server 0 died \(pid \d+ on node [^;]+; [^)]*\): restarting it \(1 of 3\)", log
    )
    assert died is not None, log[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_server_past_its_restart_budget_is_dropped_and_the_other_one_finishes_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, metrics = finished_run(
        tmp_path,
        monkeypatch,
        "server_kill@3",
        6,
        inference_num_workers=2,
        inference_max_restarts=0,
        inference_base_port=free_port_block(2),
    )
    assert metrics[-1]["faults/inference_restarts"] == 0.0
    rows = [r for r in RunDirReader(run_dir).rollouts() if r["kept"]]
    trained = {(r["step"], r["group_id"]) for r in rows}
    assert len({gid for _, gid in trained}) == len(trained) == 6 * 2
    assert {r["server"] for r in rows if r["step"] > 4} == {1}  # only the surviving server after the drop
    assert (
        "inference server 0 died 1 times (inference_max_restarts=0): dropped"
        in (run_dir / "logs" / "telescope.log").read_text()
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_that_never_answers_fails_the_run_after_stall_timeout_with_a_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telescope.core.runtime.supervision.liveness import StallError

    monkeypatch.setenv("TELESCOPE_FAULTS", "server_slow=3600")  # every request sleeps an hour first
    run_dir = tmp_path / "run"
    with pytest.raises(StallError) as info:
        train(run_dir, number_of_steps=4, stall_timeout_s=5)
    message = str(info.value)
    assert (
        "(stall_timeout_s=5) while waiting for step 1, the trainer loop in 'waiting for a batch'" in message
    )
    assert steps(run_dir) == [] and status(run_dir) == "failed"
    log = (run_dir / "logs" / "telescope.log").read_text()
    assert "stall dump: steps 0/4 done" in log
    # The one server's line and one line per group: every sample dispatched is still generating.
    # (How many were dispatched when the watchdog fired depends on the machine's speed.)
    server = re.search(r"server 0: enabled, \d+/\d+ lanes free, (\d+) samples running", log)
    assert server is not None and int(server.group(1)) > 0, log[-3000:]
    groups = [
        line for line in log.splitlines() if re.search(r"group \d+ \(reverse_text\) on server 0: ", line)
    ]
    assert groups and all(": 0/4 finished" in line for line in groups), groups
    assert sum(line.count(" generating ") for line in groups) == int(server.group(1)), groups
