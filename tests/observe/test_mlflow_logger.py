"""MLflow logger through its lifecycle, read back from the local file store with MLflow's own client."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from telescope.core.config import ConfigError, TelescopeConfig, load_config
from telescope.core.observe import SCHEMA_VERSION, TimelineEvent
from telescope.core.observe.loggers.tables import ROLLOUT_TABLE_COLUMNS
from telescope.core.testing import make_config, registry_with

pytest.importorskip("mlflow", reason="mlflow is not installed: pip install mlflow-skinny")

from mlflow.tracking import MlflowClient

from telescope.core.observe.loggers.mlflow_logger import (
    MlflowLogger,
    config_params,
    metric_key,
    tracking_uri,
)


@pytest.fixture(autouse=True)
def _no_user_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_ALLOW_FILE_STORE",
    ):  # set, then removed: restored after the test
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _artifact(client: MlflowClient, run_id: str, path: str) -> str:
    return Path(client.download_artifacts(run_id, path)).read_text()


def _cfg(**overrides: Any) -> TelescopeConfig:
    """The MLflow tests' run config: MLflow on, W&B off, run "ml", a nested backend kwarg."""
    return make_config(
        use_mlflow=True,
        use_wandb=False,
        wandb_run_name="ml",
        train_backend_kwargs={"opt": {"eps": 1e-8}},
        **overrides,
    )


def _run(run_dir: Path, status: str, make_rows, clock) -> MlflowLogger:
    cfg = _cfg(learning_rate=5e-7, metrics_logger_interval_seconds=2.0)
    component = registry_with()[1].get("logger", "mlflow")  # the built-in registration
    assert component.meta["enabled_by"] == "use_mlflow" and component.available
    lg = component.create(clock=clock)
    assert isinstance(lg, MlflowLogger)
    lg.start(cfg, run_dir)
    lg.log_events(
        [
            TimelineEvent(type="trainer", phase="start", name="train_step", step=1, time=10.0),
            TimelineEvent(type="trainer", phase="end", name="train_step", step=1, time=12.5),
        ]
    )
    lg.log_step(1, {"loss": 0.5, "reward/mean": 0.25, "bad": float("inf")})
    lg.log_rollouts(1, make_rows(1))
    lg.log_step(2, {"loss": 0.25})
    lg.log_eval(2, "math", {"pass@1": 0.5}, [{"prompt": "2+2", "score": 1.0}])
    lg.log_info({"environments": [{"name": "reverse_text"}]})
    lg.log_info({"setup_s": 3.5})
    lg.finish(status)
    return lg


def test_lifecycle_metrics_params_tags_artifacts(tmp_path: Path, make_rows, clock) -> None:
    lg = _run(tmp_path, "finished", make_rows, clock)
    ids = lg.run_ids()
    assert ids["tracking_uri"] == (tmp_path / "mlruns").resolve().as_uri() and (tmp_path / "mlruns").is_dir()
    client = MlflowClient(tracking_uri=ids["tracking_uri"])
    run = client.get_run(ids["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "ml"
    assert client.get_experiment(run.info.experiment_id).name == "telescope"
    assert _history(client, lg.run_id, "loss") == [(1, 0.5), (2, 0.25)]
    assert _history(client, lg.run_id, "reward/mean") == [(1, 0.25)]
    assert "bad" not in run.data.metrics  # inf is not sent
    assert _history(client, lg.run_id, "eval/math/pass_1") == [(2, 0.5)]  # '@' is not allowed in a key
    assert _history(client, lg.run_id, "timeline/trainer/train_step/mean_s") == [(1, 2.5)]
    params = run.data.params
    assert params["learning_rate"] == "5e-07" and params["wandb_run_name"] == "ml"
    assert params["train_backend_kwargs.opt.eps"] == "1e-08"
    assert json.loads(params["environments"]) == [
        {"kwargs": {}, "name": "reverse_text", "reward_max": None, "reward_min": None, "weight": 1.0}
    ]
    assert run.data.tags["telescope.schema_version"] == str(SCHEMA_VERSION)
    assert run.data.tags["telescope.run_dir"] == str(tmp_path.resolve())
    rollouts = json.loads(_artifact(client, lg.run_id, "rollouts/step_000001.json"))
    assert rollouts["columns"] == ROLLOUT_TABLE_COLUMNS
    completions = [row[ROLLOUT_TABLE_COLUMNS.index("completion")] for row in rollouts["data"]]
    assert completions == [r.completion_text for r in make_rows(1)]
    samples = json.loads(_artifact(client, lg.run_id, "evals/math/step_000002.json"))
    assert samples == {"columns": ["prompt", "score"], "data": [["2+2", 1.0]]}
    info = json.loads(_artifact(client, lg.run_id, "info.json"))
    assert info == {"environments": [{"name": "reverse_text"}], "setup_s": 3.5}
    assert "| trainer/train_step | 1 | 2.500 |" in _artifact(client, lg.run_id, "timeline.md")


@pytest.mark.parametrize(("status", "expected"), [("failed", "FAILED"), ("interrupted", "KILLED")])
def test_finish_status(tmp_path: Path, make_rows, clock, status: str, expected: str) -> None:
    lg = _run(tmp_path, status, make_rows, clock)
    assert MlflowClient(tracking_uri=lg.run_ids()["tracking_uri"]).get_run(lg.run_id).info.status == expected


def test_metrics_wait_for_the_interval(tmp_path: Path, clock) -> None:
    lg = MlflowLogger(clock=clock)
    lg.start(make_config(use_mlflow=True, metrics_logger_interval_seconds=2.0), tmp_path)
    client = MlflowClient(tracking_uri=lg.run_ids()["tracking_uri"])
    lg.log_step(1, {"loss": 1.0})
    lg.tick()
    assert _history(client, lg.run_id, "loss") == []
    clock.advance(2.0)
    lg.tick()
    assert _history(client, lg.run_id, "loss") == [(1, 1.0)]
    lg.finish("finished")


class FakeSlowTrackingServer:
    """Fake of a remote tracking server (a boundary we cannot reach here): the real file-store
    client, except that ``log_batch`` of metrics waits until ``release`` is set (or raises
    ``fail_with``); ``sending`` is set once a send is waiting."""

    def __init__(self, real: MlflowClient) -> None:
        self.real = real
        self.sending, self.release = threading.Event(), threading.Event()
        self.fail_with: Exception | None = None

    def log_batch(self, run_id: str, **kwargs: Any) -> None:
        if kwargs.get("metrics"):
            self.sending.set()
            assert self.release.wait(30), "the test never released the fake server"
            if self.fail_with is not None:
                raise self.fail_with
        self.real.log_batch(run_id, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _in_thread(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_slow_tracking_server_does_not_block_log_step(tmp_path: Path, clock) -> None:
    lg = MlflowLogger(clock=clock)
    lg.start(make_config(use_mlflow=True, metrics_logger_interval_seconds=2.0), tmp_path)
    server = lg.client = FakeSlowTrackingServer(lg.client)
    lg.log_step(1, {"loss": 1.0})
    clock.advance(2.0)
    ticker = _in_thread(lg.tick)  # the hub's tick thread, now stuck sending step 1
    assert server.sending.wait(30)
    logging = _in_thread(lambda: lg.log_step(2, {"loss": 0.5}))
    logging.join(timeout=20)  # generous: it returns at once unless it waits on the send
    assert not logging.is_alive(), "log_step waited for the tracking server"
    finishing = _in_thread(lambda: lg.finish("finished"))
    server.release.set()
    ticker.join(timeout=30)
    finishing.join(timeout=30)
    assert not ticker.is_alive() and not finishing.is_alive()
    client = MlflowClient(tracking_uri=lg.run_ids()["tracking_uri"])
    steps = [m.step for m in client.get_metric_history(lg.run_id, "loss")]
    assert steps == [1, 2]  # the end-of-run flush sent step 2 after the stuck send of step 1
    assert client.get_run(lg.run_id).info.status == "FINISHED"


def test_a_failed_send_is_raised_to_the_tick_thread_and_the_run_still_ends(tmp_path: Path, clock) -> None:
    lg = MlflowLogger(clock=clock)
    lg.start(make_config(use_mlflow=True, metrics_logger_interval_seconds=2.0), tmp_path)
    server = lg.client = FakeSlowTrackingServer(lg.client)
    server.release.set()
    server.fail_with = ConnectionError("tracking server unreachable")
    lg.log_step(1, {"loss": 1.0})
    clock.advance(2.0)
    with pytest.raises(ConnectionError, match="unreachable"):  # the hub's tick thread logs it
        lg.tick()
    lg.log_step(2, {"loss": 0.5})
    with pytest.raises(ConnectionError, match="unreachable"):
        lg.finish("finished")
    client = MlflowClient(tracking_uri=lg.run_ids()["tracking_uri"])
    assert client.get_run(lg.run_id).info.status == "FINISHED"


def test_resume_continues_the_same_run(tmp_path: Path, make_rows, clock) -> None:
    first = _run(tmp_path, "interrupted", make_rows, clock)
    cfg = _cfg(learning_rate=1e-6)
    second = MlflowLogger(clock=clock)
    second.start(cfg, tmp_path, first.run_ids())
    assert second.run_id == first.run_id
    client = MlflowClient(tracking_uri=second.run_ids()["tracking_uri"])
    assert client.get_run(second.run_id).info.status == "RUNNING"
    second.log_step(3, {"loss": 0.125})
    second.finish("finished")
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert _history(client, first.run_id, "loss") == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert run.data.params["learning_rate"] == "5e-07"  # MLflow params are write-once
    assert run.data.tags["telescope.params_changed_on_resume"] == "learning_rate"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_resume_of_a_deleted_run_starts_a_new_one(tmp_path: Path, make_rows, clock) -> None:
    first = _run(tmp_path, "failed", make_rows, clock)
    client = MlflowClient(tracking_uri=first.run_ids()["tracking_uri"])
    gone = dict(first.run_ids(), run_id="0" * 32)
    second = MlflowLogger(clock=clock)
    second.start(make_config(use_mlflow=True), tmp_path, gone)
    second.finish("finished")
    assert second.run_id != first.run_id
    assert client.get_run(second.run_id).data.tags["telescope.resume_missing_run_id"] == "0" * 32


def test_tracking_uri_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracking_uri(make_config(), tmp_path) == (tmp_path / "mlruns").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(make_config(), tmp_path) == "http://127.0.0.1:5000"
    assert tracking_uri(make_config(mlflow_tracking_uri="sqlite:///x.db"), tmp_path) == "sqlite:///x.db"
    assert metric_key("eval/gsm8k/pass@1") == "eval/gsm8k/pass_1"
    assert metric_key("/a//b/") == "a/b" and metric_key("x:y (z)") == "x_y _z_"
    assert config_params({"a": {"b": [1, 2]}, "c": None, "d": {}}) == {
        "a.b": "[1, 2]",
        "c": "null",
        "d": "{}",
    }


def test_missing_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    # Fake of an environment without mlflow: only the lookup the registration makes.
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a))
    registry = registry_with()[1]
    assert (
        registry.get("logger", "mlflow").unavailable == "mlflow is not installed: pip install mlflow-skinny"
    )
    with pytest.raises(ConfigError) as err:
        load_config(None, {"use_mlflow": True, "use_wandb": False, "environments": [{"name": "e"}]}, registry)
    assert [p for p in err.value.problems if p.startswith("use_mlflow")] == [
        "use_mlflow: true but the 'mlflow' logger is unavailable (mlflow is not installed: "
        "pip install mlflow-skinny); install it or set use_mlflow: false"
    ]
