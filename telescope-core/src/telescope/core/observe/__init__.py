"""Observability: loggers (local run directory, console, W&B), step metrics, timeline, system metrics.

Light at import (no torch, rich, wandb): loggers are imported when a run builds them.
A run reports through the run hooks (``hookspecs.py``, docs/run-hooks.md); the driver
registers its ``LoggerHub`` as a plugin on them, which calls the loggers. Used directly::

    hub = build_logger_hub(cfg, registry)                # local + console (+ wandb)
    hub.start(cfg, cfg.resolved_run_dir(), resume_ids)   # resume_ids: hub.run_ids() saved earlier
    pm.register(hub, name="core.logger_hub")             # what the driver does: run hooks -> loggers
    hub.log_info({"environments": environment_info(envs, cfg)})   # ranges, dataset sizes
    hub.add_prometheus_scraper({0: url0, 1: url1})       # vllm engine only
    receiver = hub.add_otlp_receiver()                   # None unless enable_vllm_tracing
    with hub.span("weight_sync", step=step): ...         # timeline events
    rows = records_from_group(group, step)               # every kept/discarded/cancelled group
    hub.log_rollouts(step, rows)
    hub.log_step(step, {**trainer_metrics, **rollout_metrics(rows), **perf_metrics(dt, tokens, lag)})
    hub.log_eval(step, "math", {"pass@1": 0.4}, sample_rows)   # evals/ files, W&B eval/math/*
    hub.add_torch_memory_source(RayDrainFetcher(trainers))     # workers run a TorchMemorySampler
    hub.finish("finished")                               # or "failed" / "interrupted"

Buffered output (system samples, W&B history, the events tail and uploads) goes out at the
seed's logging intervals from the hub's tick thread; see docs/run-directory.md.
"""

from __future__ import annotations

from telescope.core.observe.base import Logger
from telescope.core.observe.build import build_logger_hub, enabled_logger_names
from telescope.core.observe.hub import FINISH_STATUSES, LoggerHub, LoggerStartError
from telescope.core.observe.info import environment_info, eval_info
from telescope.core.observe.metrics import perf_metrics, rollout_metrics
from telescope.core.observe.rundir.reader import RunDirError, RunDirReader
from telescope.core.observe.rundir.records import (
    CANCEL_REASONS,
    DISCARD_REASONS,
    SCHEMA_VERSION,
    RolloutRecord,
    TimelineEvent,
    zero_advantage_kind,
)
from telescope.core.observe.stats import gini, max_median_ratio, split_metric_key, summary

__all__ = [
    "CANCEL_REASONS",
    "DISCARD_REASONS",
    "FINISH_STATUSES",
    "SCHEMA_VERSION",
    "Logger",
    "LoggerHub",
    "LoggerStartError",
    "RolloutRecord",
    "RunDirError",
    "RunDirReader",
    "TimelineEvent",
    "build_logger_hub",
    "enabled_logger_names",
    "environment_info",
    "eval_info",
    "gini",
    "max_median_ratio",
    "perf_metrics",
    "rollout_metrics",
    "split_metric_key",
    "summary",
    "zero_advantage_kind",
]
