"""The run's checkpoint hook (``telescope.core.runtime.checkpointing``): what the driver adds to
each checkpoint, how a failed save is handled, what a resumed run reads back, and ``kill -9``
of the saving process at each point of a save (the previous checkpoint stays loadable).

The trainer here writes plain files, so these tests need no torch; the last test kills a real
FSDP save (torch) and loads the previous checkpoint into a fresh trainer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from telescope.core.checkpoint import CheckpointManager, CheckpointNotFoundError
from telescope.core.config import ConfigError
from telescope.core.runtime.checkpointing import RunCheckpointer, find_resume_point
from telescope.core.testing import make_config, recording_hooks

HERE = Path(__file__).parent
IDS = {"local": {"run_id": "run-abc"}, "wandb": {"id": "w123", "project": "p"}}


class Orchestrator:
    """What the hook reads: ``state_dict()`` (different at every step); ``emit`` reaches the run hooks."""

    def __init__(self) -> None:
        self.hook, self.recorder = recording_hooks()
        self.step = 0

    def emit(self, event: Any) -> None:  # the real one queues it for the same hook
        self.hook.telescope_events(events=[event])

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": {"completed_steps": self.step},
            "prompts": {"outstanding": [{"group_id": 10 * self.step + i} for i in range(2)]},
        }


class FileTrainer:
    """Writes what a trainer backend writes: its weights, then ``trainer_meta.json``.

    ``fail`` lists (step, attempt) pairs whose save raises half way, as a full disk would.
    """

    def __init__(self, fail: tuple[tuple[int, int], ...] = ()) -> None:
        self.step = 0
        self.fail = fail
        self.attempts: dict[int, int] = {}

    async def save_checkpoint(self, directory: str, training_state: bool) -> None:
        attempt = self.attempts[self.step] = self.attempts.get(self.step, 0) + 1
        (Path(directory) / "weights.bin").write_text(f"weights after step {self.step}")
        if (self.step, attempt) in self.fail:
            raise OSError(28, "No space left on device")
        meta = {"backend": "fsdp", "step": self.step, "training_state": training_state}
        (Path(directory) / "trainer_meta.json").write_text(json.dumps(meta))


def config(run_dir: Path, **overrides: Any) -> Any:
    fields = {"run_dir": str(run_dir), "checkpoint_every": 2, "number_of_steps": 5, **overrides}
    return make_config(**fields)


def run_steps(hook: RunCheckpointer, orch: Orchestrator, trainer: FileTrainer, steps: range) -> None:
    for step in steps:
        orch.step = trainer.step = step
        asyncio.run(hook.after_step(orch, step))


def test_each_checkpoint_holds_the_driver_state_and_resume_reads_it_back(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", checkpoint_keep_last=2, checkpoint_save_training_state=False)
    orch, trainer, warnings = Orchestrator(), FileTrainer(), []
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, warnings.append)
    run_steps(hook, orch, trainer, range(1, 6))
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_4", "step_5"]  # saved 2, 4, 5; keep 2
    for step in (4, 5):
        folder = root / f"step_{step}"
        assert (folder / "weights.bin").read_text() == f"weights after step {step}"
        state = json.loads((folder / "orchestrator_state.json").read_text())
        assert state["counts"]["completed_steps"] == step  # taken at that step, not later
        assert [p["group_id"] for p in state["prompts"]["outstanding"]] == [10 * step, 10 * step + 1]
        assert yaml.safe_load((folder / "config.yaml").read_text()) == cfg.to_dict()
        assert json.loads((folder / "loggers.json").read_text()) == IDS
        meta = json.loads((folder / "meta.json").read_text())
        assert (meta["step"], meta["base_model"], meta["backend"]) == (step, cfg.model, cfg.train_backend)
        assert meta["training_state"] is False
    ends = [e for e in orch.recorder.events if e.type == "checkpoint" and e.phase == "end"]
    assert [(e.step, e.attrs["ok"], Path(e.attrs["path"]).name) for e in ends] == [
        (2, True, "step_2"),
        (4, True, "step_4"),
        (5, True, "step_5"),
    ]
    assert warnings == [] and hook.failures == 0

    assert find_resume_point(cfg) is None  # resume_from_checkpoint: false
    latest = find_resume_point(cfg.model_copy(update={"resume_from_checkpoint": True}))
    assert latest is not None and latest.step == 5 and latest.path == root / "step_5"
    assert latest.orchestrator_state == Orchestrator.state_dict(orch) and latest.logger_ids == IDS
    older = find_resume_point(cfg.model_copy(update={"resume_from_checkpoint": 4}))
    assert older is not None and older.orchestrator_state["counts"]["completed_steps"] == 4
    with pytest.raises(CheckpointNotFoundError, match="steps available: 4, 5"):
        find_resume_point(cfg.model_copy(update={"resume_from_checkpoint": 2}))  # removed by retention


def test_a_save_failing_twice_stops_the_run_naming_the_folder_and_the_cause(tmp_path: Path) -> None:
    from telescope.core.observe.rundir.storage import StorageError

    cfg = config(tmp_path / "run")  # checkpoint_failure: stop (the default)
    orch, trainer, failed = Orchestrator(), FileTrainer(fail=((4, 1), (4, 2))), []
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, lambda msg: None, failed.append)
    run_steps(hook, orch, trainer, range(1, 4))
    orch.step = trainer.step = 4
    with pytest.raises(StorageError) as info:
        asyncio.run(hook.after_step(orch, 4))
    root = tmp_path / "run" / "checkpoints"
    message = str(info.value)
    assert message.startswith(
        f"checkpoint at step 4 could not be written to {root / 'step_4'}: disk full (ENOSPC)"
    )
    assert (
        f"the previous checkpoint {root / 'step_2'} is intact" in message
        and "checkpoint_failure: warn" in message
    )
    assert failed == [info.value]  # the run is told at once, not only through the raise
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]
    assert (root / "step_2" / "weights.bin").read_text() == "weights after step 2"


def test_a_trainer_rank_dying_in_a_save_is_a_worker_failure_not_a_storage_fault(tmp_path: Path) -> None:
    # The driver restarts a run after a dead rank (max_run_restarts) but never after a storage fault.
    ray_exceptions = pytest.importorskip("ray.exceptions")

    class DyingTrainer(FileTrainer):
        async def save_checkpoint(self, directory: str, training_state: bool) -> None:
            self.attempts[self.step] = self.attempts.get(self.step, 0) + 1
            raise ray_exceptions.ActorDiedError()

    cfg = config(tmp_path / "run")
    orch, trainer, failed = Orchestrator(), DyingTrainer(), []
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, lambda msg: None, failed.append)
    orch.step = trainer.step = 2
    with pytest.raises(ray_exceptions.ActorDiedError):
        asyncio.run(hook.after_step(orch, 2))
    assert trainer.attempts == {2: 1} and failed == []  # no retry, no StorageError
    assert not (tmp_path / "run" / "checkpoints" / "step_2").exists()


def checkpoint_spans(orch: Orchestrator) -> list[tuple[str, int | None, dict[str, Any]]]:
    return [(e.phase, e.step, e.attrs) for e in orch.recorder.events if e.type == "checkpoint"]


def test_a_failed_save_ends_its_checkpoint_span_with_the_error(tmp_path: Path) -> None:
    from telescope.core.observe.rundir.storage import StorageError

    cfg = config(tmp_path / "run")
    orch, trainer = Orchestrator(), FileTrainer(fail=((2, 1), (2, 2)))
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, lambda msg: None)
    orch.step = trainer.step = 2
    with pytest.raises(StorageError):
        asyncio.run(hook.after_step(orch, 2))
    (start, end) = checkpoint_spans(orch)
    assert start == ("start", 2, {}) and end[:2] == ("end", 2)
    assert end[2]["ok"] is False and end[2]["path"] == ""
    assert end[2]["error"].startswith("StorageError: checkpoint at step 2 could not be written")


def test_a_cancelled_save_ends_its_checkpoint_span(tmp_path: Path) -> None:
    class HangingTrainer(FileTrainer):
        async def save_checkpoint(self, directory: str, training_state: bool) -> None:
            await asyncio.sleep(3600)

    orch = Orchestrator()
    hook = RunCheckpointer(config(tmp_path / "run"), HangingTrainer(), lambda: IDS, lambda msg: None)

    async def cancel_during_the_save() -> None:
        task = asyncio.ensure_future(hook.after_step(orch, 2))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancel_during_the_save())
    assert [(phase, attrs.get("error")) for phase, _, attrs in checkpoint_spans(orch)] == [
        ("start", None),
        ("end", "cancelled"),
    ]


@pytest.mark.parametrize(
    "wrapping", ["ray_task_error", "ray_task_error_as_cause", "raise_from", "two_levels"]
)
def test_a_trainer_death_wrapped_in_another_exception_is_still_a_trainer_death(wrapping: str) -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")
    from telescope.core.runtime.checkpointing import _trainer_died

    died = ray_exceptions.ActorDiedError()
    task_error = ray_exceptions.RayTaskError("save_checkpoint", "Traceback ...", died)
    if wrapping == "ray_task_error":
        wrapped: BaseException = task_error
    elif wrapping == "ray_task_error_as_cause":
        wrapped = task_error.as_instanceof_cause()
    else:
        wrapped = RuntimeError("rank 0: the save's all-gather failed")
        wrapped.__cause__ = task_error if wrapping == "two_levels" else died
    assert _trainer_died(wrapped)
    storage = OSError(28, "No space left on device")
    assert not _trainer_died(ray_exceptions.RayTaskError("save_checkpoint", "Traceback ...", storage))
    assert not _trainer_died(storage)


def test_a_wrapped_trainer_death_in_a_save_is_not_retried_as_a_storage_fault(tmp_path: Path) -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")

    class DyingTrainer(FileTrainer):
        async def save_checkpoint(self, directory: str, training_state: bool) -> None:
            self.attempts[self.step] = self.attempts.get(self.step, 0) + 1
            raise ray_exceptions.RayTaskError(
                "save_checkpoint", "Traceback ...", ray_exceptions.ActorDiedError()
            )

    orch, trainer, failed = Orchestrator(), DyingTrainer(), []
    hook = RunCheckpointer(config(tmp_path / "run"), trainer, lambda: IDS, lambda msg: None, failed.append)
    orch.step = trainer.step = 2
    with pytest.raises(ray_exceptions.RayTaskError):
        asyncio.run(hook.after_step(orch, 2))
    assert trainer.attempts == {2: 1} and failed == []  # the driver's trainer recovery decides


def test_a_save_failing_twice_is_a_warning_with_checkpoint_failure_warn(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", checkpoint_keep_last=1, checkpoint_failure="warn")
    orch, trainer, warnings = Orchestrator(), FileTrainer(fail=((4, 1), (4, 2), (2, 1))), []
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, warnings.append)
    run_steps(hook, orch, trainer, range(1, 5))
    root = tmp_path / "run" / "checkpoints"
    assert trainer.attempts == {2: 2, 4: 2}  # step 2 succeeded on its retry, step 4 failed both
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]  # no partial folder left behind
    assert (root / "step_2" / "weights.bin").read_text() == "weights after step 2"
    assert hook.failures == 1 and len(warnings) == 1
    assert "step 4" in warnings[0] and "disk full (ENOSPC)" in warnings[0] and "intact" in warnings[0]
    ends = [(e.step, e.attrs["ok"], e.attrs["path"]) for e in orch.recorder.events if e.phase == "end"]
    assert ends == [(2, True, str(root / "step_2")), (4, False, "")]
    resume = find_resume_point(cfg.model_copy(update={"resume_from_checkpoint": True}))
    assert resume is not None and resume.step == 2
    run_steps(hook, orch, trainer, range(5, 6))  # the last step saves again; training went on
    assert sorted(p.name for p in root.iterdir()) == ["step_5"]


def test_resume_refuses_a_folder_without_driver_state(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", resume_from_checkpoint=True)
    mgr = CheckpointManager(tmp_path / "run" / "checkpoints")
    partial = mgr.begin(3)
    (partial / "weights.bin").write_text("converted or hand-made")
    mgr.commit(partial, 3)
    with pytest.raises(ConfigError, match="has no orchestrator_state.json"):
        find_resume_point(cfg)


# --- kill -9 during a save ---------------------------------------------------------------

CHILD = """
import asyncio, json, os, shutil, signal, sys
from pathlib import Path
sys.path.insert(0, {here!r})
import test_run_checkpointer as t
from telescope.core.runtime.checkpointing import RunCheckpointer

point, run_dir = sys.argv[1], Path(sys.argv[2])
cfg = t.config(run_dir, checkpoint_every=1, checkpoint_keep_last=1)
orch, trainer = t.Orchestrator(), t.FileTrainer()
hook = RunCheckpointer(cfg, trainer, lambda: t.IDS, print)
t.run_steps(hook, orch, trainer, range(1, 2))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "trainer_files":
    trainer.save_checkpoint = lambda directory, ts: (Path(directory, "weights.bin").write_text("half"), die())
elif point == "driver_files":
    import telescope.core.config
    telescope.core.config.config_to_yaml = die  # orchestrator_state.json written, config.yaml not
elif point == "meta":
    os.replace = die  # meta.json.tmp written, not yet renamed to meta.json
elif point == "rename":
    real = os.rename
    os.rename = lambda src, dst: die() if Path(dst).name == "step_2" else real(src, dst)
elif point == "retention":
    shutil.rmtree = die  # step_2 committed, step_1 moved aside for deletion
t.run_steps(hook, orch, trainer, range(2, 3))
sys.exit(3)
"""


@pytest.mark.parametrize(
    ("point", "survivor"),
    [("trainer_files", 1), ("driver_files", 1), ("meta", 1), ("rename", 1), ("retention", 2)],
)
def test_kill_minus_nine_during_a_save_leaves_a_complete_checkpoint(
    tmp_path: Path, point: str, survivor: int
) -> None:
    run_dir = tmp_path / "run"
    code = CHILD.format(here=str(HERE))
    proc = subprocess.run([sys.executable, "-c", code, point, str(run_dir)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    root = run_dir / "checkpoints"
    assert any(p.name.startswith(".step_") for p in root.iterdir())  # the killed save left debris
    cfg = config(run_dir, checkpoint_every=1, checkpoint_keep_last=1, resume_from_checkpoint=True)
    resume = find_resume_point(cfg)
    assert resume is not None and resume.step == survivor
    assert (resume.path / "weights.bin").read_text() == f"weights after step {survivor}"
    assert resume.orchestrator_state["counts"]["completed_steps"] == survivor
    assert resume.logger_ids == IDS
    # The restarted run removes the debris, and its next save works.
    orch, trainer = Orchestrator(), FileTrainer()
    hook = RunCheckpointer(cfg, trainer, lambda: IDS, print)
    assert sorted(p.name for p in root.iterdir()) == [f"step_{survivor}"]
    run_steps(hook, orch, trainer, range(3, 4))
    assert sorted(p.name for p in root.iterdir()) == ["step_3"]


FSDP_CHILD = """
import asyncio, os, signal, sys, torch
from pathlib import Path
sys.path[:0] = [{fsdp!r}, {here!r}]
from ckpt_helpers import make_backend, resume_config, run_steps, weights
import telescope.fsdp.checkpoint as fsdp_checkpoint
from telescope.core.runtime.checkpointing import RunCheckpointer

model_dir, run_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = resume_config(model_dir, run_dir=run_dir, checkpoint_every=1, checkpoint_keep_last=1)
backend = make_backend(cfg)

class Trainer:
    async def save_checkpoint(self, directory, training_state):
        backend.save_checkpoint(directory, training_state=training_state)

class Orchestrator:
    def emit(self, event):
        pass
    def state_dict(self):
        return {{"counts": {{"completed_steps": step}}}}

hook = RunCheckpointer(cfg, Trainer(), dict, print)
step = 1
run_steps(backend, cfg, range(0, 1))
asyncio.run(hook.after_step(Orchestrator(), 1))
torch.save(weights(backend), out)
step = 2
run_steps(backend, cfg, range(1, 2))
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
fsdp_checkpoint.save_rng_states = die  # the model and optimizer files of step 2 are on disk
asyncio.run(hook.after_step(Orchestrator(), 2))
sys.exit(3)
"""


@pytest.mark.usefixtures("one_rank_group")
def test_kill_minus_nine_inside_an_fsdp_save_keeps_the_previous_checkpoint_loadable(
    untied_model_dir: str, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("telescope.fsdp")
    from ckpt_helpers import make_backend, resume_config, weights

    run_dir, saved = tmp_path / "run", tmp_path / "step1_weights.pt"
    code = FSDP_CHILD.format(fsdp=str(HERE.parent / "fsdp"), here=str(HERE))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-c", code, untied_model_dir, str(run_dir), str(saved)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    root = run_dir / "checkpoints"
    (debris,) = [p for p in root.iterdir() if p.name.startswith(".step_2.partial-")]
    assert (debris / ".metadata").is_file() and not (debris / "meta.json").exists()
    cfg = resume_config(
        untied_model_dir, run_dir=str(run_dir), checkpoint_every=1, resume_from_checkpoint=True
    )
    resume = find_resume_point(cfg)
    assert resume is not None and resume.step == 1
    fresh = make_backend(cfg)
    assert fresh.load_checkpoint(str(resume.path)) == {"step": 1, "training_state": True}
    expected = torch.load(saved)
    loaded = weights(fresh)
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():
        torch.testing.assert_close(tensor, expected[name], atol=0, rtol=0)
