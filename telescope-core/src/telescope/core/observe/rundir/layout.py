"""File names of the run directory (schema in ``docs/run-directory.md``) and small file helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = [
    "CONFIG_FILE",
    "EVALS_DIR",
    "EVAL_METRICS_FILE",
    "EVAL_SAMPLES_FILE",
    "EVENTS_DIR",
    "EVENTS_FILE",
    "EVENTS_TAIL_FILE",
    "LEGACY_EVENTS_TAIL_FILE",
    "LOGS_DIR",
    "METRICS_FILE",
    "ROLLOUTS_DIR",
    "ROLLOUTS_FILE",
    "RUN_FILE",
    "SYSTEM_FILE",
    "config_to_dict",
    "write_json_atomic",
]

RUN_FILE = "run.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
#: Schema 1 single files (read for old run directories; schema 2 writes the block folders).
ROLLOUTS_FILE = "rollouts.jsonl"
EVENTS_FILE = "events.jsonl"
#: ``rollouts/block_{k}.jsonl.zst`` (by step), ``events/block_{k}.jsonl.zst`` (by time) + tail
#: (schema 2 wrote them as plain ``.jsonl``; ``blocks.block_files`` lists both).
ROLLOUTS_DIR = "rollouts"
EVENTS_DIR = "events"
EVENTS_TAIL_FILE = "events/tail.jsonl.zst"
#: Schema 2's plain tail (read when a directory has no compressed one).
LEGACY_EVENTS_TAIL_FILE = "events/tail.jsonl"
EVALS_DIR = "evals"
EVAL_METRICS_FILE = "evals/metrics.jsonl"
EVAL_SAMPLES_FILE = "evals/samples.jsonl"
SYSTEM_FILE = "system.jsonl"
LOGS_DIR = "logs"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to a temp file and rename it over ``path`` (never a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def config_to_dict(cfg: TelescopeConfig) -> dict[str, Any]:
    """The resolved config as plain data (what config.yaml and the loggers' params hold), secrets
    redacted (``telescope.core.config.secrets``)."""
    from telescope.core.config.secrets import redact_secrets

    result: dict[str, Any] = redact_secrets(cfg.to_dict())
    return result
