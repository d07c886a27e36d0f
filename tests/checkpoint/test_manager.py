"""CheckpointManager: atomic commit, crash leftovers, retention, resume resolution (no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from telescope.core.checkpoint import CheckpointManager, CheckpointNotFoundError, checkpoint_due
from telescope.core.config import ConfigError


def save(mgr: CheckpointManager, step: int, payload: str = "") -> Path:
    partial = mgr.begin(step)
    (partial / "weights.bin").write_text(payload or f"weights of step {step}")
    (partial / "sub").mkdir()
    (partial / "sub" / "x.txt").write_text("x")
    return mgr.commit(partial, step, meta={"backend": "fsdp"})


@pytest.mark.parametrize(
    ("step", "every", "total", "due"),
    [
        (5, 5, 20, True),
        (6, 5, 20, False),
        (20, 5, 20, True),
        (7, 5, 7, True),  # the last step is always saved
        (7, 0, 7, False),  # 0 / false disable, even at the last step
        (7, False, 7, False),
        (1, 1, 3, True),
    ],
)
def test_checkpoint_due(step: int, every: int | bool, total: int, due: bool) -> None:
    assert checkpoint_due(step, every, total) is due


def test_commit_writes_meta_last_and_renames(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ckpts")
    partial = mgr.begin(3)
    assert partial.parent == mgr.root and partial.name.startswith(".step_3.partial-")
    assert list(partial.iterdir()) == [] and mgr.steps() == []
    (partial / "a.txt").write_text("a")
    final = mgr.commit(partial, 3, meta={"base_model": "m", "training_state": True})
    assert final == tmp_path / "ckpts" / "step_3" and not partial.exists()
    meta = mgr.read_meta(final)
    assert meta["format"] == "telescope-checkpoint" and meta["version"] == 1 and meta["step"] == 3
    assert meta["base_model"] == "m" and meta["training_state"] is True and meta["created"].endswith("Z")
    assert (final / "a.txt").read_text() == "a" and not (final / "meta.json.tmp").exists()
    assert mgr.steps() == [3] and mgr.latest() == 3 and mgr.path(3) == final


def test_commit_replaces_an_existing_step(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    save(mgr, 4, "old")
    save(mgr, 4, "new")
    assert (mgr.path(4) / "weights.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4"]


def test_crash_between_the_two_renames_of_a_replacement_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = CheckpointManager(tmp_path)
    save(mgr, 4, "old")
    real_rename, calls = os.rename, []

    def dies_on_second_rename(src: object, dst: object) -> None:
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("simulated crash")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", dies_on_second_rename)
    partial = mgr.begin(4)
    (partial / "weights.bin").write_text("new")
    with pytest.raises(OSError, match="simulated crash"):
        mgr.commit(partial, 4)
    monkeypatch.setattr(os, "rename", real_rename)
    assert mgr.steps() == []  # step_4 was moved aside: the next start-up must bring it back
    restarted = CheckpointManager(tmp_path)
    assert restarted.cleanup_partials() == 1  # the unfinished partial
    assert restarted.steps() == [4] and (restarted.path(4) / "weights.bin").read_text() == "old"


def test_interrupted_saves_are_invisible_and_cleaned_up(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    save(mgr, 2)
    crashed = mgr.begin(4)  # a save that died before commit
    (crashed / "half.bin").write_text("partial data")
    (tmp_path / "step_9").mkdir()  # no meta.json: never committed (or hand-made): ignored, kept
    assert mgr.steps() == [2] and mgr.latest() == 2
    assert mgr.resolve(True) == mgr.path(2)
    assert mgr.cleanup_partials() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_9"]
    aborted = mgr.begin(5)
    mgr.abort(aborted)
    assert not aborted.exists() and mgr.steps() == [2]


def test_commit_rejects_a_folder_not_made_by_begin(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="begin"):
        mgr.commit(tmp_path / "mine", 1)
    with pytest.raises(ValueError, match="integer >= 0"):
        mgr.begin(-1)
    with pytest.raises(ValueError, match="checkpoint_keep_last is 0"):
        CheckpointManager(tmp_path, keep_last=0)


@pytest.mark.parametrize(
    ("keep_last", "keep_every", "remaining"),
    [
        (None, None, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
        (2, None, {9, 10}),
        (1, None, {10}),
        (3, 4, {4, 8, 9, 10}),
        (None, 3, {3, 6, 9, 10}),  # the newest is always kept
        (2, 5, {5, 9, 10}),
        (20, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
    ],
)
def test_retention_after_ten_saves(
    tmp_path: Path, keep_last: int | None, keep_every: int | None, remaining: set[int]
) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=keep_last, keep_every=keep_every)
    for step in range(1, 11):
        save(mgr, step)
        assert step in mgr.steps()  # the one just written always survives
    assert set(mgr.steps()) == remaining
    assert {p.name for p in tmp_path.iterdir()} == {f"step_{s}" for s in remaining}


def test_retention_keeps_the_checkpoint_just_written_when_resumed_from_an_older_one(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        save(mgr, step)
    save(mgr, 2, "rewritten after resuming from step 1")  # newest two are 2 and 3
    assert mgr.steps() == [2, 3] and "rewritten" in (mgr.path(2) / "weights.bin").read_text()


def test_resuming_from_an_older_step_sets_the_later_checkpoints_aside(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    for step in (2, 4, 6):
        save(mgr, step)
    moved = mgr.set_aside_after(2)
    # The old history is kept in full, out of reach of resume and retention.
    assert [p.name for p in moved] == ["step_4", "step_6"] and mgr.steps() == [2]
    assert all(p.parent.parent == tmp_path / "superseded" for p in moved)
    assert (moved[1] / "weights.bin").read_text() == "weights of step 6"
    assert mgr.resolve(True) == mgr.path(2)  # an interrupted resumed run restarts from its own history
    save(mgr, 3)
    assert mgr.steps() == [2, 3] and mgr.set_aside_after(3) == []


def test_resume_sets_aside_only_for_an_older_step(tmp_path: Path) -> None:
    from telescope.core.runtime.checkpointing import ResumePoint, supersede_later_checkpoints
    from telescope.core.testing import make_config

    cfg = make_config(checkpoint_dir=str(tmp_path), resume_from_checkpoint=True)
    mgr = CheckpointManager(tmp_path)
    for step in (1, 2):
        save(mgr, step)
    newest = ResumePoint(path=mgr.path(2), step=2, orchestrator_state={}, logger_ids={})
    assert supersede_later_checkpoints(cfg, newest) == [] and mgr.steps() == [1, 2]
    older = ResumePoint(path=mgr.path(1), step=1, orchestrator_state={}, logger_ids={})
    assert [p.name for p in supersede_later_checkpoints(cfg, older)] == ["step_2"] and mgr.steps() == [1]


def test_resolve_true_int_and_errors(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "none-yet")
    with pytest.raises(CheckpointNotFoundError, match="no complete checkpoint") as empty:
        mgr.resolve(True)
    assert isinstance(empty.value, ConfigError)
    for step in (3, 6):
        save(mgr, step)
    assert mgr.resolve(True) == mgr.path(6) and mgr.resolve(3) == mgr.path(3)
    with pytest.raises(CheckpointNotFoundError, match=r"resume_from_checkpoint: 4.*steps available: 3, 6"):
        mgr.resolve(4)
    with pytest.raises(FileNotFoundError, match="meta.json"):
        mgr.read_meta(tmp_path)


def test_meta_is_json_with_caller_fields(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    final = save(mgr, 1)
    assert json.loads((final / "meta.json").read_text())["backend"] == "fsdp"


def test_checkpoint_modules_import_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, telescope.core.checkpoint as c, telescope.core.checkpoint.convert, "
        "telescope.core.checkpoint.rng, telescope.core.checkpoint.hf_meta, telescope.cli.commands.checkpoint; "
        "c.convert_checkpoint; heavy = {'torch', 'transformers', 'ray'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_failed_commit_leaves_the_previous_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1)
    save(mgr, 1, "good")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    partial = mgr.begin(2)
    (partial / "weights.bin").write_text("new")
    monkeypatch.setattr(json, "dump", disk_full)
    with pytest.raises(OSError, match="No space left"):
        mgr.commit(partial, 2)
    monkeypatch.undo()
    assert mgr.steps() == [1] and (mgr.path(1) / "weights.bin").read_text() == "good"  # retention never ran
    mgr.abort(partial)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
