"""``telescope ui --wandb ENTITY/PROJECT[/RUN]``: W&B runs copied into a local cache of run
directories, which the dashboard then reads like any other.

The W&B logger uploads the run directory's records under their own relative paths
(``wandb_uploads``: run.json, config.yaml, metrics.jsonl, evals/, rollout and event blocks,
events/tail.jsonl.zst, logs). Those files are downloaded as they are. A run logged before those
uploads existed has no run.json there: one is written from the W&B run's name, state and
times, config.yaml from its config, and metrics.jsonl from its history (the scalars of each
step), so its Metrics page still works; rollouts then come from the blocks only if uploaded.
Every call to ``pull_runs`` downloads again what changed (a live run's files grow).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from telescope.core.observe.rundir.layout import CONFIG_FILE, METRICS_FILE, RUN_FILE, write_json_atomic
from telescope.core.observe.rundir.records import SCHEMA_VERSION

__all__ = ["cache_root", "pull_run", "pull_runs"]

#: Run-directory files the dashboard reads (paths inside the W&B run's files).
_WANTED = re.compile(
    r"^(run\.json|config\.yaml|metrics\.jsonl|system\.jsonl|evals/[^/]+\.jsonl|"
    r"(rollouts|events)/(block_\d+|tail)\.jsonl(\.zst)?|rollouts\.jsonl|events\.jsonl|logs/.+\.log)$"
)
_STATUS = {
    "running": "running",
    "finished": "finished",
    "failed": "failed",
    "crashed": "failed",
    "killed": "interrupted",
}


def cache_root() -> Path:
    """``$TELESCOPE_CACHE_DIR/wandb-runs`` (default ``~/.cache/telescope/wandb-runs``)."""
    base = os.environ.get("TELESCOPE_CACHE_DIR") or str(Path.home() / ".cache" / "telescope")
    return Path(base) / "wandb-runs"


def _api() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError("telescope ui --wandb needs wandb: pip install wandb (and wandb login)") from None
    return wandb.Api()


def _parse(target: str) -> tuple[str, str, str | None]:
    parts = [p for p in target.strip("/").split("/") if p]
    if len(parts) not in (2, 3):
        raise ValueError(
            f"--wandb {target!r}: use ENTITY/PROJECT (every run) or ENTITY/PROJECT/RUN_ID (one run)"
        )
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _synthesize(run: Any, folder: Path) -> None:
    """run.json, config.yaml and metrics.jsonl from the W&B run itself (runs without uploaded records)."""
    if not (folder / RUN_FILE).exists():
        meta = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run.id,
            "name": run.name,
            "status": _STATUS.get(str(run.state), str(run.state)),
            "created_at": _created_at(run),
            "starts": 1,
            "info": {"wandb": {"path": "/".join(run.path)}},
        }
        write_json_atomic(folder / RUN_FILE, meta)
    if not (folder / CONFIG_FILE).exists():
        (folder / CONFIG_FILE).write_text(
            yaml.safe_dump(dict(run.config or {}), sort_keys=False), encoding="utf-8"
        )
    if not (folder / METRICS_FILE).exists() or (folder / ".from_history").exists():
        lines = []
        for row in run.scan_history():
            step = row.get("_step")
            metrics = {
                k: v
                for k, v in row.items()
                if not k.startswith("_") and isinstance(v, int | float) and not isinstance(v, bool)
            }
            if isinstance(step, int) and metrics:
                lines.append(
                    json.dumps({"step": step, "time": row.get("_timestamp") or 0.0, "metrics": metrics})
                )
        (folder / METRICS_FILE).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (folder / ".from_history").write_text("metrics.jsonl rebuilt from the W&B history\n")


def _created_at(run: Any) -> float:
    from datetime import datetime

    created = getattr(run, "created_at", None)
    try:
        return datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pull_run(run: Any, root: Path) -> Path:
    """Download one W&B run's run-directory files into ``root/<entity>/<project>/<run id>``."""
    folder = root.joinpath(*run.path)
    folder.mkdir(parents=True, exist_ok=True)
    uploaded_meta = False
    for f in run.files():
        if not _WANTED.match(f.name):
            continue
        local = folder / f.name
        if local.exists() and local.stat().st_size == getattr(f, "size", -1) and f.name != RUN_FILE:
            continue  # unchanged (files only grow); run.json is rewritten in place, fetch it always
        f.download(root=str(folder), replace=True)
        uploaded_meta |= f.name == RUN_FILE
    if uploaded_meta:
        (folder / ".from_history").unlink(missing_ok=True)
    _synthesize(run, folder)
    return folder


def pull_runs(target: str, root: Path | None = None, api: Any = None) -> Path:
    """Pull ``ENTITY/PROJECT`` (every run) or ``ENTITY/PROJECT/RUN``; returns the folder to serve."""
    entity, project, run_id = _parse(target)
    api = api if api is not None else _api()
    root = root if root is not None else cache_root()
    if run_id:
        return pull_run(api.run(f"{entity}/{project}/{run_id}"), root)
    for run in api.runs(f"{entity}/{project}"):
        pull_run(run, root)
    return root / entity / project
