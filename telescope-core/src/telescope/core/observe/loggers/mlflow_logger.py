"""``mlflow`` logger (``use_mlflow``): one MLflow run per Telescope run, in a file store under the run directory by default.

Tracking URI: ``mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a file store in
``RUN_DIR/mlruns`` (``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it). MLflow 3
refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE`` is true (it steers new servers to a
database); for a file store URI this logger sets it when the user has not, because a file
store needs no database packages and keeps the run self-contained.

What goes where: the config as params (nested keys dotted, lists as JSON); tags
``telescope.*`` (schema version, run directory, model, algorithm); step metrics, eval scores
(``eval/<name>/<metric>``) and the timeline's per-step span durations
(``timeline/<span>/{mean_s,max_s,count}``, see ``spans``) as metrics with their step; rollouts
(``rollouts/step_<k>.json``), eval samples (``evals/<name>/step_<k>.json``), run info
(``info.json``) and the span totals (``timeline.md``) as artifacts. Metric names MLflow
refuses (``pass@1``) have each invalid character replaced by ``_``. Metrics and artifacts are
queued and sent every ``metrics_logger_interval_seconds`` from the hub's tick thread, outside
the queue's lock, so a slow tracking server never blocks training; a failed send is raised there
(the tick thread logs it) or from ``finish``. ``finish(status)`` ends the run FINISHED, FAILED
(``failed``) or KILLED (``interrupted``); ``run_ids()`` lets a resumed run continue it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from telescope.core.observe.loggers.scalars import ScalarLogger, import_for
from telescope.core.observe.loggers.tables import ROLLOUT_TABLE_COLUMNS, eval_table, rollout_table_row
from telescope.core.observe.periodic import IntervalBuffer
from telescope.core.observe.rundir.layout import config_to_dict
from telescope.core.observe.rundir.records import SCHEMA_VERSION, RolloutRecord

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["MLFLOW_DIR", "RUN_STATUS", "MlflowLogger", "config_params", "metric_key", "tracking_uri"]

#: Default file store, inside the run directory.
MLFLOW_DIR = "mlruns"
#: ``finish`` status -> MLflow run status.
RUN_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}

# MLflow's limits (mlflow.utils.validation): entities per log_batch call, param value length.
_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_PARAM_CHARS = 6000
_TAG_CHARS = 8000
_INVALID_KEY_CHARS = re.compile(r"[^\w\-. /]")


def tracking_uri(cfg: TelescopeConfig, run_dir: Path) -> str:
    """``mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``RUN_DIR/mlruns`` as a file URI."""
    uri = cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    return str(uri) if uri else (Path(run_dir) / MLFLOW_DIR).resolve().as_uri()


def is_file_store(uri: str) -> bool:
    """True for a local folder (``file:`` URI or a plain path)."""
    return urlparse(uri).scheme in ("", "file")


def metric_key(name: str) -> str:
    """``name`` with each character MLflow refuses in metric/param keys replaced by ``_``."""
    key = _INVALID_KEY_CHARS.sub("_", name)
    # MLflow also refuses keys that normalise to another path ("a//b", "/a", "a/").
    return "/".join(part for part in key.split("/") if part not in ("", ".", "..")) or "_"


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 1] + "…"


def config_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as MLflow params: nested dicts as dotted keys, anything else as JSON text."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{metric_key(str(key))}"
        if isinstance(value, dict) and value:
            out.update(config_params(value, f"{name}."))
        else:
            out[name] = _param_value(value)
    return out


@dataclass
class _Artifact:
    """A JSON (dict) or text file to write under the run's artifacts."""

    path: str
    data: dict[str, Any] | str


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MlflowLogger(ScalarLogger):
    """One MLflow run per Telescope run; a resumed run continues the run in ``resume_ids``.

    Args:
        with_rollouts: write each step's rollouts and each eval's samples as JSON artifacts.
        clock: monotonic seconds for the send interval (tests inject one).
    """

    name = "mlflow"

    def __init__(self, *, with_rollouts: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.with_rollouts = with_rollouts
        self.client: Any = None
        self.run_id: str | None = None
        self._ids: dict[str, Any] = {}
        self._clock = clock
        self._queue: IntervalBuffer[Any] | None = None
        self._info: dict[str, Any] = {}

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        tracking = import_for("use_mlflow", "mlflow.tracking", "mlflow-skinny")
        uri = tracking_uri(cfg, run_dir)
        if is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = tracking.MlflowClient(tracking_uri=uri)
        experiment = cfg.mlflow_experiment_name
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else self.client.create_experiment(experiment)
        )
        run = self._resume((resume_ids or {}).get("run_id"))
        if run is None:
            run = self.client.create_run(
                experiment_id,
                run_name=cfg.wandb_run_name or None,
                tags=self._tags(cfg, run_dir),
            )
            if resume_ids and resume_ids.get("run_id"):
                self._tag("telescope.resume_missing_run_id", str(resume_ids["run_id"]), run.info.run_id)
        self.run_id = run.info.run_id
        self._ids = {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": uri}
        self._log_params(config_params(config_to_dict(cfg)), dict(run.data.params))
        self._queue = IntervalBuffer(
            self._send,
            cfg.metrics_logger_interval_seconds,
            clock=self._clock,
            max_items=5000,
        )

    def _resume(self, run_id: str | None) -> Any:
        """The run to continue (set RUNNING again), or None when there is none or it is gone."""
        if not run_id:
            return None
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run

    @staticmethod
    def _tags(cfg: TelescopeConfig, run_dir: Path) -> dict[str, str]:
        return {
            "telescope.schema_version": str(SCHEMA_VERSION),
            "telescope.run_dir": str(Path(run_dir).resolve()),
            "telescope.model": cfg.model,
            "telescope.algorithm": cfg.algorithm,
        }

    def _tag(self, key: str, value: str, run_id: str | None = None) -> None:
        self.client.set_tag(run_id or self.run_id, key, value[:_TAG_CHARS])

    def _log_params(self, params: dict[str, str], existing: dict[str, str]) -> None:
        """Log the params the run does not have; MLflow refuses to change one, so a resumed run
        whose config changed lists the changed keys in the ``telescope.params_changed_on_resume`` tag."""
        from mlflow.entities import Param

        new = [Param(k, v) for k, v in params.items() if k not in existing]
        for chunk in _chunks(new, _BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=chunk)
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            self._tag("telescope.params_changed_on_resume", ", ".join(changed))

    def _put(self, *items: Any) -> None:
        if self._queue is None:
            raise RuntimeError("mlflow logger: logged before start(): call LoggerHub.start first")
        self._queue.add(*items)

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        self._put(*(Metric(metric_key(k), v, now_ms, step) for k, v in values.items()))

    def _send(self, items: list[Any]) -> None:
        """Send in order: each run of metrics as batches, each artifact as a file."""
        metrics: list[Any] = []
        for item in [*items, None]:
            if item is not None and not isinstance(item, _Artifact):
                metrics.append(item)
                continue
            for chunk in _chunks(metrics, _BATCH_METRICS):
                self.client.log_batch(self.run_id, metrics=chunk)
            metrics = []
            if isinstance(item, _Artifact) and isinstance(item.data, dict):
                self.client.log_dict(self.run_id, item.data, item.path)
            elif isinstance(item, _Artifact):
                self.client.log_text(self.run_id, item.data, item.path)

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        if rows and self.with_rollouts:
            table = {"columns": ROLLOUT_TABLE_COLUMNS, "data": [rollout_table_row(r) for r in rows]}
            self._put(_Artifact(f"rollouts/step_{step:06d}.json", table))

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        super().log_eval(step, name, metrics, rows)
        if rows and self.with_rollouts:
            columns, data = eval_table(rows)
            self._put(
                _Artifact(
                    f"evals/{metric_key(name)}/step_{step:06d}.json", {"columns": columns, "data": data}
                )
            )

    def log_info(self, info: dict[str, Any]) -> None:
        self._info.update(info)
        self._put(_Artifact("info.json", json.loads(json.dumps(self._info, default=str))))

    def tick(self) -> None:
        queue = self._queue  # finish() may clear it from the caller's thread meanwhile
        if queue is not None:
            queue.tick()

    def finish(self, status: str) -> None:
        if self.run_id is None or self._queue is None:
            return
        self.flush_spans(None)
        if self.spans.totals():
            self._put(_Artifact("timeline.md", self.spans.summary_markdown()))
        try:
            self._queue.flush()
        finally:  # a tracking server that fails the last send still gets the run's end
            self._queue = None
            self.client.set_terminated(self.run_id, RUN_STATUS.get(status, "FAILED"))

    def run_ids(self) -> dict[str, Any]:
        return dict(self._ids)
