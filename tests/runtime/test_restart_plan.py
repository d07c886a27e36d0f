"""When a failed run restarts from its checkpoint, and when it stops (``driver._restart_plan``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core.checkpoint import CheckpointManager
from telescope.core.observe.rundir.storage import StorageError
from telescope.core.runtime.driver import _restart_plan
from telescope.core.testing import make_config

ray = pytest.importorskip("ray")


def checkpointed(run_dir: Path, step: int) -> None:
    mgr = CheckpointManager(run_dir / "checkpoints")
    partial = mgr.begin(step)
    (Path(partial) / "orchestrator_state.json").write_text(json.dumps({"counts": {"completed_steps": step}}))
    mgr.commit(partial, step, meta={})


def session(run_dir: Path, step: int, **fields: Any) -> Any:
    cfg = make_config(run_dir=str(run_dir), checkpoint_every=2, **fields)
    return SimpleNamespace(cfg=cfg, trainers=[], current_step=lambda: step)


def worker_error(text: str = "gloo: Connection closed by peer") -> Exception:
    return ray.exceptions.RayError(text)  # what a failed trainer call raises (no rank found dead here)


def test_a_worker_failure_restarts_from_the_latest_checkpoint_until_it_repeats(tmp_path: Path) -> None:
    checkpointed(tmp_path, 2)
    checkpointed(tmp_path, 4)
    seen: set[Any] = set()
    plan = _restart_plan(worker_error(), session(tmp_path, 5), seen, 0)
    assert plan is not None and plan.point.step == 4 and "Connection closed by peer" in plan.reason
    # the same failure at the same step again: deterministic, no second restart
    assert _restart_plan(worker_error(), session(tmp_path, 5), seen, 1) is None
    # the same failure at another step, or another failure at the same step: restart again
    assert _restart_plan(worker_error(), session(tmp_path, 6), seen, 1) is not None
    assert _restart_plan(worker_error("NCCL timeout"), session(tmp_path, 5), seen, 1) is not None


def test_no_restart_past_the_budget_without_a_checkpoint_or_for_driver_failures(tmp_path: Path) -> None:
    assert _restart_plan(worker_error(), session(tmp_path, 3), set(), 0) is None  # no checkpoint yet
    checkpointed(tmp_path, 2)
    assert _restart_plan(worker_error(), session(tmp_path, 3, max_run_restarts=1), set(), 1) is None
    assert _restart_plan(worker_error(), session(tmp_path, 3, max_run_restarts=0), set(), 0) is None
    full = StorageError("checkpoint at step 4 could not be written: disk full (ENOSPC)")
    full.__cause__ = worker_error(
        "OSError: [Errno 28]"
    )  # written by a trainer, still not healed by a restart
    assert _restart_plan(full, session(tmp_path, 4), set(), 0) is None
    assert _restart_plan(ValueError("an environment's bug"), session(tmp_path, 3), set(), 0) is None
    assert _restart_plan(worker_error(), session(tmp_path, 3), set(), 0) is not None


def test_a_hung_trainer_restarts_like_a_dead_rank_until_it_hangs_at_the_same_step_again(
    tmp_path: Path,
) -> None:
    from telescope.core.runtime.supervision.heartbeat import TrainerHungError

    def hung(running_for: str, ranks: list[int]) -> TrainerHungError:
        return TrainerHungError(f"step 7 is overdue: running for {running_for}; trainer rank ...", ranks, [])

    assert _restart_plan(hung("1m01s", [1]), session(tmp_path, 7), set(), 0) is None  # no checkpoint yet
    checkpointed(tmp_path, 4)
    seen: set[Any] = set()
    plan = _restart_plan(hung("1m01s", [1]), session(tmp_path, 7), seen, 0)
    assert plan is not None and plan.point.step == 4
    assert plan.reason == "TrainerHungError: step 7 is overdue: running for 1m01s; trainer rank ..."
    # the same ranks hung at the same step again (other durations): deterministic, the run stops
    assert _restart_plan(hung("1m04s", [1]), session(tmp_path, 7), seen, 1) is None
    assert _restart_plan(hung("1m04s", [0]), session(tmp_path, 7), seen, 1) is not None
