"""TensorBoard logger through its lifecycle, read back from the event files with TensorBoard's own reader."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from telescope.core.config import ConfigError, load_config
from telescope.core.observe import TimelineEvent
from telescope.core.observe.loggers.tables import markdown_table
from telescope.core.testing import make_config, registry_with

pytest.importorskip("tensorboard", reason="tensorboard is not installed: pip install tensorboard")
pytest.importorskip("torch.utils.tensorboard", reason="torch is not installed")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from telescope.core.observe.loggers.tensorboard_logger import TensorBoardLogger


def _read(log_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, str]]]]:
    """({scalar tag: [(step, value)]}, {text tag: [(step, text)]}) as TensorBoard loads them."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = {}
    for tag in acc.Tags()["tensors"]:
        name = tag.removesuffix("/text_summary")
        texts[name] = [
            (e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()) for e in acc.Tensors(tag)
        ]
    return scalars, texts


def _span(type: str, start: float, end: float, step: int, end_step: int | None = None, **ids: Any) -> list:
    return [
        TimelineEvent(type=type, phase="start", time=start, step=step, **ids),
        TimelineEvent(type=type, phase="end", time=end, step=step if end_step is None else end_step, **ids),
    ]


def test_lifecycle_scalars_text_and_timeline(tmp_path: Path, make_rows) -> None:
    cfg = make_config(use_tensorboard=True, use_wandb=False, wandb_run_name="tb")
    component = registry_with()[1].get("logger", "tensorboard")  # the built-in registration
    assert component.meta["enabled_by"] == "use_tensorboard" and component.available
    lg = component.create()
    assert isinstance(lg, TensorBoardLogger)
    lg.start(cfg, tmp_path)
    # Step 1: a 2.5 s train step; two rollouts of 1 s and 3 s (the first ends after the
    # orchestrator moved on to step 2: it still counts for step 1, where it started).
    lg.log_events(
        _span("trainer", 100.0, 102.5, 1, name="train_step")
        + _span("generation", 100.0, 101.0, 1, end_step=2, group_id=0, sample_id=0)
        + _span("generation", 100.5, 103.5, 1, group_id=0, sample_id=1)
        + [TimelineEvent(type="weight_sync", phase="end", step=1, attrs={"duration_s": 0.75})]
    )
    lg.log_step(1, {"loss": 0.5, "reward/mean": 0.25, "bad": float("nan"), "note": "text"})  # type: ignore[dict-item]
    lg.log_rollouts(1, make_rows(1))
    lg.log_events(_span("trainer", 110.0, 111.0, 2, name="train_step"))
    lg.log_step(2, {"loss": 0.25})
    lg.log_eval(2, "math", {"pass@1": 0.5, "n": 10}, [{"prompt": "2+2", "score": 1.0}])
    lg.log_info({"environments": [{"name": "reverse_text"}]})
    lg.finish("failed")

    scalars, texts = _read(tmp_path / "tensorboard")
    assert scalars["loss"] == [(1, 0.5), (2, 0.25)]
    assert scalars["reward/mean"] == [(1, 0.25)]
    assert "bad" not in scalars and "note" not in scalars  # NaN and text are not scalars
    assert scalars["timeline/trainer/train_step/mean_s"] == [(1, 2.5), (2, 1.0)]
    assert scalars["timeline/generation/mean_s"] == [(1, (1.0 + 3.0) / 2)]
    assert scalars["timeline/generation/max_s"] == [(1, 3.0)]
    assert scalars["timeline/generation/count"] == [(1, 2.0)]
    assert scalars["timeline/weight_sync/mean_s"] == [(1, 0.75)]
    assert scalars["eval/math/pass@1"] == [(2, 0.5)] and scalars["eval/math/n"] == [(2, 10.0)]

    [(step, rollouts)] = texts["rollouts"]
    kept = [r for r in make_rows(1) if r.kept]
    assert step == 1 and rollouts.count("\n") == 1 + len(make_rows(1))  # header, rule, one line a row
    assert all(f"| {r.completion_text} |" in rollouts for r in kept)
    assert texts["eval/math/samples"] == [(2, "| prompt | score |\n|---|---|\n| 2+2 | 1.0 |")]
    assert texts["info"][0][0] == 2 and '"name": "reverse_text"' in texts["info"][0][1]
    assert texts["run/status"] == [(2, "failed")]
    [(_, summary)] = texts["timeline/summary"]
    assert "| trainer/train_step | 2 | 3.500 | 1.750 | 2.500 |" in summary
    assert texts["config"][0][0] == 0 and '"wandb_run_name": "tb"' in texts["config"][0][1]
    assert lg.run_ids() == {"log_dir": str(tmp_path / "tensorboard")}


def test_resume_replaces_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    cfg = make_config(use_tensorboard=True, use_wandb=False, tensorboard_dir=str(tmp_path / "tb"))
    first = TensorBoardLogger()
    first.start(cfg, tmp_path / "run")
    for step, loss in ((1, 1.0), (2, 2.0), (3, 3.0)):
        first.log_step(step, {"loss": loss})
    first.finish("interrupted")
    # The checkpoint was at step 1: the resumed run logs steps 2.. again.
    second = TensorBoardLogger()
    second.start(cfg, tmp_path / "run", first.run_ids())
    second.log_info({"resumed": True})
    second.log_step(2, {"loss": 20.0})
    second.finish("finished")

    scalars, texts = _read(tmp_path / "tb")
    assert scalars["loss"] == [(1, 1.0), (2, 20.0)]
    assert texts["run/status"][-1] == (2, "finished")
    assert any(step == 2 and '"resumed": true' in text for step, text in texts["info"])


def test_markdown_cells_stay_on_one_line() -> None:
    table = markdown_table(["a", "b"], [["x|y", "line1\nline2"], ["z" * 12, None]], max_chars=11)
    assert table.splitlines() == [
        "| a | b |",
        "|---|---|",
        "| x\\|y | line1<br>line2 |",
        "| zzzzzzzzzzz… (+1 chars) | None |",
    ]


def test_missing_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    # Fake of an environment without tensorboard: only the lookup the registration makes.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a)
    )
    registry = registry_with()[1]
    comp = registry.get("logger", "tensorboard")
    assert comp.unavailable == "tensorboard is not installed: pip install tensorboard torch"
    env = [{"name": "tb_env"}]
    with pytest.raises(ConfigError) as err:
        load_config(None, {"use_tensorboard": True, "use_wandb": False, "environments": env}, registry)
    assert [p for p in err.value.problems if p.startswith("use_tensorboard")] == [
        "use_tensorboard: true but the 'tensorboard' logger is unavailable (tensorboard is not installed: "
        "pip install tensorboard torch); install it or set use_tensorboard: false"
    ]
