"""``telescope ui --wandb``: W&B runs pulled into run directories, with the wandb API replaced at
its boundary by ``FakeWandbApi`` (a fake: there is no W&B server here)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from ui_runs import step_rows, write_run

from telescope.cli.ui.data import RunData
from telescope.cli.ui.rollouts import RolloutFilter
from telescope.cli.ui.wandb_pull import pull_runs


class FakeFile:
    """A file of a W&B run (``run.files()``): ``download`` copies it from a source folder."""

    def __init__(self, source: Path, name: str) -> None:
        self.source, self.name = source, name
        self.size = (source / name).stat().st_size
        self.downloads = 0

    def download(self, root: str, replace: bool = False) -> None:
        assert replace
        self.downloads += 1
        dest = Path(root) / self.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.source / self.name, dest)


class FakeRun:
    def __init__(
        self, run_id: str, files: list[FakeFile], history: list[dict[str, Any]] | None = None
    ) -> None:
        self.id, self.name, self.state = run_id, f"name-{run_id}", "crashed"
        self.path = ["ent", "proj", run_id]
        self.config = {"algorithm": "grpo", "number_of_steps": 2}
        self.created_at = "2026-01-01T00:00:00Z"
        self._files, self._history = files, history or []

    def files(self) -> list[FakeFile]:
        return self._files

    def scan_history(self) -> list[dict[str, Any]]:
        return self._history


class FakeWandbApi:
    """Stands in for ``wandb.Api()``: ``runs("ent/proj")`` and ``run("ent/proj/id")``."""

    def __init__(self, runs: list[FakeRun]) -> None:
        self._runs = {r.id: r for r in runs}

    def runs(self, path: str) -> list[FakeRun]:
        assert path == "ent/proj"
        return list(self._runs.values())

    def run(self, path: str) -> FakeRun:
        return self._runs[path.split("/")[-1]]


def _uploaded(run_dir: Path) -> list[FakeFile]:
    """The files our W&B logger uploads, as W&B lists them (paths relative to the run dir)."""
    names = [p.relative_to(run_dir).as_posix() for p in sorted(run_dir.rglob("*")) if p.is_file()]
    return [FakeFile(run_dir, n) for n in names]


def test_pulled_run_reads_like_the_local_one(tmp_path: Path) -> None:
    write_run(tmp_path / "local", steps=3)
    files = _uploaded(tmp_path / "local")
    api = FakeWandbApi([FakeRun("abc", files)])
    folder = pull_runs("ent/proj", root=tmp_path / "cache", api=api)
    assert folder == tmp_path / "cache" / "ent" / "proj"
    pulled, local = RunData(folder / "abc", "abc"), RunData(tmp_path / "local", "local")
    assert pulled.metric_series(["entropy"]) | {"created_at": 0} == local.metric_series(["entropy"]) | {
        "created_at": 0
    }
    assert pulled.rollout_query(2, RolloutFilter())["total"] == len(step_rows(2))
    assert pulled.summary()["status"] == "finished"  # run.json came from the upload, not the W&B state
    # a second pull downloads only what changed (run.json always: it is rewritten in place)
    pull_runs("ent/proj/abc", root=tmp_path / "cache", api=api)
    assert {f.name for f in files if f.downloads == 2} == {"run.json"}


def test_run_without_uploaded_records_is_rebuilt_from_history(tmp_path: Path) -> None:
    history = [
        {"_step": 1, "_timestamp": 10.0, "reward/mean": 0.5, "rollouts": {"_type": "table"}},
        {"_step": 2, "_timestamp": 11.0, "reward/mean": 0.75},
    ]
    api = FakeWandbApi([FakeRun("old", [], history)])
    folder = pull_runs("ent/proj/old", root=tmp_path / "cache", api=api)
    run = RunData(folder, "old")
    assert run.metric_series(["reward/mean"])["values"]["reward/mean"] == [0.5, 0.75]
    summary = run.summary()
    assert (summary["status"], summary["name"], summary["highlights"]["algorithm"]) == (
        "failed",
        "name-old",
        "grpo",
    )


def test_bad_target_names_the_forms() -> None:
    with pytest.raises(ValueError, match="use ENTITY/PROJECT"):
        pull_runs("just-a-project", api=FakeWandbApi([]))
