"""Issue #33 below the browser: run health recorded in run.json and read back (dashboard and
``runs show``), the metric registry, the layout store and its state-changing routes, tracebacks
at ERROR, rollout sorting."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request
from typer.testing import CliRunner
from ui_runs import log_step, start_hub, step_rows

from telescope.cli.app import app
from telescope.cli.health import run_health
from telescope.cli.ui.layouts import LayoutError, LayoutStore
from telescope.cli.ui.logs import LogStore
from telescope.cli.ui.metric_docs import describe, without_duplicates
from telescope.cli.ui.rollouts import list_row, sort_rows
from telescope.cli.ui.server import Refused, check_state_change
from telescope.core.observe import perf_metrics, rollout_metrics
from telescope.core.observe.loggers.local import RECENT_STEPS, next_progress
from telescope.core.observe.rundir.reader import read_run_meta


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---- run health -----------------------------------------------------------------------------------
def test_the_local_logger_records_the_step_in_progress_and_recent_durations(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    hub = start_hub(tmp_path / "run", clock=clock)
    progress = read_run_meta(tmp_path / "run")["progress"]
    assert progress == {
        "step": None,
        "step_started_at": 1000.0,
        "last_step": None,
        "last_step_at": None,
        "recent_step_seconds": [],
    }
    for step, at in ((1, 1030.0), (2, 1032.5), (3, 1036.0)):
        clock.t = at
        log_step(hub, step)
    progress = read_run_meta(tmp_path / "run")["progress"]
    # the first step holds the set-up (30 s): not a step duration
    assert progress == {
        "step": 4,
        "step_started_at": 1036.0,
        "last_step": 3,
        "last_step_at": 1036.0,
        "recent_step_seconds": [2.5, 3.5],
    }
    hub.finish("finished")
    # a resume keeps the durations; its first train_step names the step in progress
    clock.t = 2000.0
    hub = start_hub(tmp_path / "run", clock=clock)
    with hub.span("trainer", name="train_step", step=4):
        pass
    progress = read_run_meta(tmp_path / "run")["progress"]
    assert progress["step"] == 4 and progress["step_started_at"] == 2000.0
    assert progress["recent_step_seconds"] == [2.5, 3.5]
    hub.finish("finished")


def test_recent_durations_keep_the_latest_steps() -> None:
    progress: dict[str, Any] = {}
    for step in range(1, RECENT_STEPS + 10):
        progress = next_progress(progress, step, float(step * step))
    # step s was logged at s^2: the duration of step s is s^2 - (s-1)^2 = 2s - 1
    expected = [2.0 * s - 1 for s in range(2, RECENT_STEPS + 10)][-RECENT_STEPS:]
    assert progress["recent_step_seconds"] == expected


def _meta(status: str, started_ago: float, recent: list[float], now: float = 10_000.0) -> dict[str, Any]:
    return {
        "status": status,
        "progress": {
            "step": 7,
            "step_started_at": now - started_ago,
            "last_step": 6,
            "last_step_at": now - started_ago,
            "recent_step_seconds": recent,
        },
    }


@pytest.mark.parametrize(
    ("started_ago", "recent", "state"),
    [
        (5.0, [4.0, 6.0, 5.0], "ok"),
        (16.0, [4.0, 6.0, 5.0], "slow"),  # > max(2 * 5, 5 + 10) = 15
        (64.0, [4.0, 6.0, 5.0], "slow"),  # not > max(5 * 5, 5 + 60) = 65
        (66.0, [4.0, 6.0, 5.0], "overdue"),
        (250.0, [40.0, 60.0], "slow"),  # > 2 * 50 = 100, not > 5 * 50 = 250
        (251.0, [40.0, 60.0], "overdue"),
        (999.0, [], "ok"),  # no step timed yet: nothing to compare with
    ],
)
def test_health_states(started_ago: float, recent: list[float], state: str) -> None:
    assert run_health(_meta("running", started_ago, recent), 10_000.0)["state"] == state


def test_health_text_and_ended_runs() -> None:
    health = run_health(_meta("running", 125.0, [2.0, 4.0]), 10_000.0)
    assert health["text"] == "step 7 running for 2m05s (median step 3s) · last step 2m05s ago"
    ended = run_health(_meta("finished", 125.0, [2.0]), 10_000.0)
    assert ended["state"] == "ended" and ended["text"] == "last step 2m05s ago"
    assert run_health({"status": "running"}, 0.0) == {"state": "unknown", "text": ""}


def test_runs_show_says_a_step_is_overdue(tmp_path: Path) -> None:
    clock = Clock(time.time() - 900)
    hub = start_hub(tmp_path / "run", clock=clock)
    for step in (1, 2, 3):
        clock.t += 1.0
        log_step(hub, step)
    out = CliRunner().invoke(app, ["runs", "show", str(tmp_path / "run")], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "overdue: step 4 running for 14m" in out.output and "(median step 1s)" in out.output
    as_json = json.loads(CliRunner().invoke(app, ["runs", "show", str(tmp_path / "run"), "--json"]).output)
    assert as_json["health"]["state"] == "overdue" and as_json["health"]["step"] == 4
    hub.finish("finished")


def test_after_a_restart_the_step_after_the_checkpoint_runs_since_the_restart(tmp_path: Path) -> None:
    """What the driver records when a hung trainer restarts the run from checkpoint step 4, and what
    ``runs show`` and the dashboard's data make of it (issue #28)."""
    from telescope.cli.ui.data import RunData

    run_dir = tmp_path / "run"
    restart_at = time.time() - 252.0  # the restarted step has run 4m12s by now
    clock = Clock(restart_at - 70.0 - 6 * 0.5)
    hub = start_hub(run_dir, clock=clock, number_of_steps=20)
    for step in range(1, 7):  # steps of 0.5 s (the first holds the set-up: not timed)
        clock.t += 0.5
        log_step(hub, step)
    clock.t = restart_at  # step 7 hung for 70 s, then the run restarted from step 4's checkpoint
    hub.log_info({"restarts": [{"from_step": 4, "reason": "TrainerHungError: ...", "time": restart_at}]})
    meta = read_run_meta(run_dir)
    assert meta["progress"]["step"] == 5 and meta["progress"]["step_started_at"] == restart_at
    assert meta["progress"]["recent_step_seconds"] == [0.5] * 5
    # the step the restart redoes, and how long it has run, against the median of the recorded ones
    text = run_health(meta, restart_at + 252.0)["text"]
    assert text == "step 5 running for 4m12s (median step 0.5s) · last step 5m22s ago"
    pattern = r"step 5 running for 4m1\ds \(median step 0\.5s\)"  # the clock moves while they read
    shown = CliRunner().invoke(app, ["runs", "show", str(run_dir)], env={"COLUMNS": "200"}).output
    assert re.search(pattern, shown), shown
    board = RunData(run_dir, "run")
    assert re.fullmatch(pattern + r" · last step 5m2\ds ago", board.summary()["health"]["text"])
    assert re.fullmatch(pattern + r" · last step 5m2\ds ago", board.revisions()["health"]["text"])
    # the first step after the restart holds its set-up: not a step duration; the next one is
    clock.t = restart_at + 30.0
    log_step(hub, 5)
    clock.t += 0.75
    log_step(hub, 6)
    assert read_run_meta(run_dir)["progress"]["recent_step_seconds"] == [0.5] * 5 + [0.75]
    hub.finish("finished")


# ---- metric registry ------------------------------------------------------------------------------
def test_every_key_our_loggers_write_has_a_sentence() -> None:
    rows = [r for s in (1, 2) for r in step_rows(s)]
    rows[0].env = "other_env"  # two environments: the per-environment keys too
    keys = set(rollout_metrics(rows)) | set(perf_metrics(2.0, 100, 1))
    keys |= {
        "entropy",
        "kl_divergence_inference",
        "grad_norm",
        "learning_rate",
        "timing_forward_total",
        "timing_forward_microbatch_mean",
        "timing_step_total",
        "totals/discarded_groups/max_async",
        "totals/reward_errors/reverse_text",
        "faults/inference_restarts",
    }
    assert not [k for k in sorted(keys) if describe(k) is None]
    assert (
        describe("reward/mean")
        == "Reward of the kept samples as the environment returned it (raw_reward): mean over the step."
    )
    assert (
        describe("timing_forward_total")
        == "Trainer phase forward, summed over the step's micro-batches, in seconds."
    )
    assert describe("my_custom_key") is None
    assert without_duplicates(["async_level", "entropy", "perf/async_level"]) == [
        "entropy",
        "perf/async_level",
    ]
    assert without_duplicates(["async_level"]) == ["async_level"]  # kept when the other is absent


# ---- logs -------------------------------------------------------------------------------------------
def test_a_traceback_and_the_line_it_follows_are_errors(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "telescope.log").write_text(
        "2026-01-01 10:00:00,001 INFO a started\n"
        "2026-01-01 10:00:01,001 INFO a step 3 failed\n"
        "Traceback (most recent call last):\n"
        "ValueError: boom\n"
        "2026-01-01 10:00:02,001 INFO a after\n"
    )
    entries = LogStore(tmp_path).query()["entries"]
    assert [e["level"] for e in entries] == ["INFO", "ERROR", "ERROR", "ERROR", "INFO"]


# ---- rollouts ------------------------------------------------------------------------------------------
def test_sorting_rollouts() -> None:
    rows = [list_row(r.to_dict()) for r in step_rows(2)]
    by_reward = sort_rows(rows, "reward")
    assert [r["reward"] for r in by_reward] == sorted(r["reward"] for r in rows)
    by_outcome = [r["outcome"] for r in sort_rows(rows, "-outcome")]
    assert by_outcome == sorted((r["outcome"] for r in rows), reverse=True)
    with pytest.raises(ValueError, match="sort='prompt_ids' is not a rollout column: use one of group_id"):
        sort_rows(rows, "prompt_ids")


# ---- layouts --------------------------------------------------------------------------------------------
def test_layout_store_refuses_names_and_links_that_leave_the_root(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    sections = [{"name": "a", "keys": ["entropy", "entropy", "reward/mean"]}]
    assert store.save(sections) == [{"name": "a", "keys": ["entropy", "reward/mean"]}]
    assert store.export("mine").name == "mine.json" and store.exported() == ["mine"]
    for bad in ("../x", "/etc/passwd", "a/b", ".hidden", "", None, "x" * 65):
        with pytest.raises(LayoutError, match="is not a plain name"):
            store.export(bad)
    with pytest.raises(LayoutError, match="'keys' must be a list"):
        store.save([{"name": "a", "keys": "entropy"}])
    # a link inside the root that points out of it is not followed
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "evil.json").write_text('{"sections": []}')
    (store.dir / "layouts" / "evil.json").symlink_to(tmp_path / "outside" / "evil.json")
    with pytest.raises(LayoutError, match="outside the runs root"):
        store.import_("evil")


def _request(host: str, content_type: str, peer: str = "127.0.0.1") -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: {
        "peername": (peer, 50000),
        "sockname": ("127.0.0.1", 8005),
    }.get(name, default)
    return make_mocked_request(
        "PUT", "/api/layout", headers={"Host": host, "Content-Type": content_type}, transport=transport
    )


@pytest.mark.parametrize(
    ("host", "content_type", "peer", "status", "says"),
    [
        ("127.0.0.1:8005", "application/json", "10.1.2.3", 403, "client 10.1.2.3 is not on this machine"),
        ("127.0.0.1:8005", "text/plain", "127.0.0.1", 415, "content type 'text/plain' refused"),
        ("evil.example:8005", "application/json", "127.0.0.1", 403, "Host 'evil.example:8005' does not name"),
        ("localhost:9999", "application/json", "127.0.0.1", 403, "Host 'localhost:9999' does not name"),
    ],
)
def test_state_changing_requests_are_refused_unless_local_json_and_named(
    host: str, content_type: str, peer: str, status: int, says: str
) -> None:
    with pytest.raises(Refused, match=says) as refused:
        check_state_change(_request(host, content_type, peer))
    assert refused.value.status == status


def test_state_changing_requests_accepted_from_this_machine() -> None:
    for host in ("127.0.0.1:8005", "localhost:8005", "[::1]:8005"):
        check_state_change(_request(host, "application/json", "::1" if host.startswith("[") else "127.0.0.1"))
