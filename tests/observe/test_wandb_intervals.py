"""W&B logger with a fake ``wandb`` module: history batched at metrics_logger_interval_seconds,
event tail and closed blocks uploaded at event_upload_interval_seconds, evals as scalars and tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from telescope.core.observe import LoggerHub
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.loggers.wandb_logger import WandbLogger
from telescope.core.testing import make_config


def _cfg(**fields: Any) -> Any:
    return make_config(use_wandb=True, wandb_upload_code=False, wandb_upload_logs=False, **fields)


def _hub(tmp_path: Path, clock: Any, cfg: Any, **wandb_kwargs: Any) -> tuple[LoggerHub, WandbLogger]:
    wb = WandbLogger(code_root=str(tmp_path), clock=clock, **wandb_kwargs)
    hub = LoggerHub([LocalLogger(clock=clock), wb])
    hub.start(cfg, tmp_path / "run", system_metrics=False, ticker=False)
    return hub, wb


def test_history_is_sent_in_order_every_metrics_logger_interval(
    tmp_path, clock, fake_wandb, make_rows
) -> None:
    hub, _ = _hub(tmp_path, clock, _cfg(metrics_logger_interval_seconds=2.0))
    run = fake_wandb.runs[0]
    hub.log_step(1, {"reward/mean": 0.5})
    hub.log_rollouts(1, make_rows(1))
    clock.advance(1.0)
    hub.log_step(2, {"reward/mean": 0.75})
    hub.tick()  # 1 s < 2 s: nothing sent yet
    assert run.logged == []
    clock.advance(1.0)
    hub.tick()  # 2 s: the three queued entries, in call order
    assert [(sorted(data), step) for data, step in run.logged] == [
        (["reward/mean"], 1),
        (["rollouts"], 1),
        (["reward/mean"], 2),
    ]
    assert len(run.logged[1][0]["rollouts"].data) == len(make_rows(1))
    hub.log_step(3, {"reward/mean": 1.0})
    clock.advance(0.5)
    hub.tick()
    assert len(run.logged) == 3
    hub.finish("finished")  # finish sends the rest before closing the run
    assert run.logged[-1] == ({"reward/mean": 1.0}, 3) and run.finished == 0


def _saved_names(run: Any, folders: tuple[str, ...] = ("events/", "rollouts/")) -> list[str]:
    """Names of the uploaded files under ``folders`` (the record files have their own test)."""
    return [name for name, _, _ in run.saved if name.startswith(folders)]


def _saved_blocks(run: Any) -> list[tuple[str, str, str]]:
    return [s for s in run.saved if s[0].startswith(("events/", "rollouts/"))]


def test_event_tail_and_closed_blocks_upload_every_event_interval(
    tmp_path, clock, fake_wandb, make_rows
) -> None:
    cfg = _cfg(
        event_upload_interval_seconds=5,
        event_block_duration_seconds=10,
        event_tail_window_seconds=3,
        rollout_block_size=2,
    )
    hub, _ = _hub(tmp_path, clock, cfg)
    run = fake_wandb.runs[0]
    clock.at(1003.0)
    hub.event("generation", "start", step=1, group_id=0, sample_id=0)
    hub.log_rollouts(1, make_rows(1))  # rollouts block 0
    clock.at(1004.0)
    hub.tick()
    assert run.saved == []  # 4 s < 5 s
    clock.at(1005.0)
    hub.tick()  # local rewrites the tail (window 1002..1005), then W&B uploads it; blocks still open
    assert _saved_names(run) == ["events/tail.jsonl.zst"]
    assert '"generation"' in _saved_blocks(run)[0][1] and _saved_blocks(run)[0][2] == "now"
    clock.at(1012.0)
    hub.event("reward", "end", step=1)  # events block 1 opens: block 0 is closed
    hub.log_rollouts(2, make_rows(2))  # still rollouts block 1 = steps 2..3
    hub.tick()  # 7 s since the last upload
    assert _saved_names(run)[1:] == [
        "events/tail.jsonl.zst",
        "events/block_000000.jsonl.zst",
        "rollouts/block_000000.jsonl.zst",
    ]
    clock.at(1020.0)
    hub.tick()  # the tail's window 1017..1020 is now empty: changed, uploaded again
    assert _saved_names(run)[4:] == ["events/tail.jsonl.zst"] and _saved_blocks(run)[4][1] == ""
    clock.at(1026.0)
    hub.tick()  # rewritten, still empty: same content is not uploaded again; closed blocks already sent
    assert len(_saved_blocks(run)) == 5
    hub.finish("finished")  # the open blocks go at finish
    assert sorted(_saved_names(run)[5:]) == [
        "events/block_000001.jsonl.zst",
        "rollouts/block_000001.jsonl.zst",
    ]


def test_run_records_upload_when_changed(tmp_path, clock, fake_wandb, make_rows) -> None:
    """run.json, config.yaml, metrics.jsonl and evals/metrics.jsonl go up every interval when they
    changed (what ``telescope ui --wandb`` reads); system.jsonl and eval samples at finish."""
    hub, _ = _hub(tmp_path, clock, _cfg(event_upload_interval_seconds=5))
    run = fake_wandb.runs[0]
    records = ("run.json", "config.yaml", "metrics.jsonl", "evals/", "system.jsonl")
    hub.log_step(1, {"reward/mean": 0.5})
    clock.advance(5)
    hub.tick()
    first = _saved_names(run, records)
    assert {"run.json", "config.yaml", "metrics.jsonl"} <= set(first) and "system.jsonl" not in first
    assert [c for n, c, _ in run.saved if n == "metrics.jsonl"][-1].count("\n") == 1
    clock.advance(5)
    hub.tick()
    assert _saved_names(run, records) == first  # nothing changed: nothing sent again
    hub.log_step(2, {"reward/mean": 0.7})
    clock.advance(5)
    hub.tick()
    # a step rewrites run.json too (its progress: the step in progress, recent step durations)
    assert _saved_names(run, records)[len(first) :] == ["run.json", "metrics.jsonl"]
    assert [c for n, c, _ in run.saved if n == "metrics.jsonl"][-1].count("\n") == 2
    hub.finish("finished")
    assert '"finished"' in [c for n, c, _ in run.saved if n == "run.json"][-1]


def test_eval_scalars_and_sample_table(tmp_path, clock, fake_wandb) -> None:
    hub, _ = _hub(tmp_path, clock, _cfg())
    run = fake_wandb.runs[0]
    rows = [
        {"prompt": "1+1", "completion": "2", "reward": 1.0, "info": {"k": 1}},
        {"prompt": "2+2", "reward": 0.0},
    ]
    hub.log_eval(10, "math", {"pass@1": 0.5, "accuracy": 0.25}, rows)
    hub.finish("finished")
    ((data, step),) = run.logged
    assert step == 10
    assert {k: v for k, v in data.items() if k != "eval/math/samples"} == {
        "eval/math/pass@1": 0.5,
        "eval/math/accuracy": 0.25,
    }
    table = data["eval/math/samples"]
    assert table.columns == ["completion", "info", "prompt", "reward"]
    assert table.data == [["2", '{"k": 1}', "1+1", 1.0], [None, None, "2+2", 0.0]]


def test_upload_rollouts_off_sends_scalars_only(tmp_path, clock, fake_wandb, make_rows) -> None:
    hub, _ = _hub(tmp_path, clock, _cfg(), upload_rollouts=False)
    run = fake_wandb.runs[0]
    hub.log_rollouts(1, make_rows(1))
    hub.log_eval(1, "math", {"pass@1": 1.0}, [{"prompt": "p"}])
    hub.finish("finished")
    assert run.logged == [({"eval/math/pass@1": 1.0}, 1)]
