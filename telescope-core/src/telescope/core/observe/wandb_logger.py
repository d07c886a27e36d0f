"""``wandb`` logger (``use_wandb``): step metrics as scalars, rollouts as tables, code and logs.

Honours every seed ``wandb_*`` field. ``WANDB_MODE=offline`` works without network; the W&B
files then live under ``RUN_DIR/wandb/``. Timeline events and system samples stay in the
local run directory (W&B samples its own system stats).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from telescope.core.observe.base import Logger
from telescope.core.observe.code_files import select_code_files
from telescope.core.observe.layout import LOGS_DIR, config_to_dict
from telescope.core.observe.records import SCHEMA_VERSION, RolloutRecord

__all__ = ["ROLLOUT_TABLE_COLUMNS", "WandbLogger", "log_files_to_upload"]

#: Columns of the ``rollouts`` table (token ids stay in the local rollouts.jsonl).
ROLLOUT_TABLE_COLUMNS = [
    "step", "group_id", "sample_id", "env", "prompt", "completion", "reward", "advantage", "kept",
    "discard_reason", "stop_reason", "model_version", "prompt_tokens", "completion_tokens", "server",
    "lane", "sample_metrics",
]  # fmt: skip


def _table_row(r: RolloutRecord) -> list[Any]:
    return [
        r.step, r.group_id, r.sample_id, r.env, r.prompt_text, r.completion_text, r.reward, r.advantage,
        r.kept, r.discard_reason or "", r.stop_reason, r.model_version, r.prompt_tokens,
        r.completion_tokens, r.server, r.lane, json.dumps(r.sample_metrics, sort_keys=True),
    ]  # fmt: skip


def log_files_to_upload(run_dir: Path, *, logs: bool, detailed: bool, stdout: bool) -> list[Path]:
    """Files under ``RUN_DIR/logs`` selected by the upload switches.

    ``*.detailed.log`` needs ``detailed``, ``*.stdout.log`` needs ``stdout``, other ``*.log``
    files need ``logs``; with ``logs`` off nothing is uploaded.
    """
    if not logs:
        return []
    out = []
    for path in sorted((run_dir / LOGS_DIR).rglob("*.log")):
        if path.name.endswith(".detailed.log"):
            ok = detailed
        elif path.name.endswith(".stdout.log"):
            ok = stdout
        else:
            ok = True
        if ok:
            out.append(path)
    return out


class WandbLogger(Logger):
    """One W&B run per Telescope run; resumes the same id when ``resume_ids`` has it."""

    name = "wandb"

    def __init__(self, code_root: str | None = None) -> None:
        self.code_root = Path(code_root or os.getcwd())
        self.run: Any = None
        self._cfg: Any = None
        self._run_dir: Path | None = None
        self._ids: dict[str, Any] = {}

    def start(self, cfg: Any, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "use_wandb is true but wandb is not installed: pip install wandb, or set use_wandb: false"
            ) from None
        self._cfg, self._run_dir = cfg, Path(run_dir)
        resume_id = (resume_ids or {}).get("id")
        tags = list(getattr(cfg, "wandb_tags", []) or []) + [f"schema_version:{SCHEMA_VERSION}"]
        self.run = wandb.init(
            project=cfg.wandb_project,
            name=cfg.wandb_run_name,
            tags=tags,
            config=config_to_dict(cfg),
            dir=str(self._run_dir),
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        self._ids = {"id": self.run.id, "project": self.run.project}
        if cfg.wandb_upload_code:
            self._upload_code()

    def _upload_code(self) -> None:
        cfg = self._cfg
        files = set(
            select_code_files(
                self.code_root, cfg.wandb_code_max_file_size_mb, list(cfg.wandb_code_exclude_patterns)
            )
        )
        root = str(self.code_root)
        self.run.log_code(
            root=root,
            include_fn=lambda path, root=root: os.path.relpath(path, root) in files,
            exclude_fn=lambda path, root=root: os.path.relpath(path, root) not in files,
        )

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        if not rows:
            return
        import wandb

        table = wandb.Table(columns=list[Any](ROLLOUT_TABLE_COLUMNS), data=[_table_row(r) for r in rows])
        self.run.log({"rollouts": table}, step=step)

    def log_info(self, info: dict[str, Any]) -> None:
        for key, value in info.items():
            self.run.summary[key] = value

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        cfg, run_dir = self._cfg, self._run_dir
        assert run_dir is not None
        for path in log_files_to_upload(
            run_dir,
            logs=cfg.wandb_upload_logs,
            detailed=cfg.wandb_upload_logs_detailed,
            stdout=cfg.wandb_upload_logs_stdout,
        ):
            self.run.save(str(path), base_path=str(run_dir), policy="now")
        self.run.finish(exit_code=0 if status == "finished" else 1)
        self.run = None

    def run_ids(self) -> dict[str, Any]:
        return dict(self._ids)
