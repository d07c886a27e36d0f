"""W&B logger in offline mode: scalars, rollout tables, code and logs, resume — read back from the files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from telescope.core.observe import SCHEMA_VERSION, LoggerHub, rollout_metrics
from telescope.core.observe.loggers.code_files import is_excluded, select_code_files
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.loggers.wandb_logger import ROLLOUT_TABLE_COLUMNS, log_files_to_upload
from telescope.core.observe.rundir.jsonl import read_jsonl
from telescope.core.testing import make_config


def _code_tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "train.py").write_text("print('hi')\n")
    (root / "run.yaml").write_text("algorithm: grpo\n")
    (root / "big.bin").write_bytes(b"0" * 300_000)
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "site.py").write_text("x = 1\n")
    (root / "pkg" / "skip_me.log").write_text("noise\n")


def test_select_code_files(tmp_path: Path) -> None:
    _code_tree(tmp_path)
    assert select_code_files(tmp_path, 0.25, [".venv", "*.log"]) == ["pkg/train.py", "run.yaml"]
    assert "big.bin" not in select_code_files(tmp_path, 1.0, [".venv"])  # not a source file
    assert is_excluded("a/b/__pycache__/x.pyc", ["__pycache__"]) and not is_excluded("src/x.py", ["*.pyc"])


def test_code_upload_never_takes_secrets(tmp_path: Path) -> None:
    """What a run's working directory often holds besides code: none of it may leave the machine."""
    secrets = [
        ".env",
        ".env.local",
        "prod.env",
        "id_rsa",
        "id_ed25519.pub",
        ".aws/credentials",
        ".ssh/config",
        "certs/server.key",
        "certs/server.pem",
        "gcp-credentials.yaml",
        "my_secret.yaml",
        ".netrc",
        ".git/config",
        ".config/gh/hosts.yml",
    ]
    sources = ["train.py", "configs/run.yaml", "Makefile", "README.md", "envs/tokenizer.py"]
    for rel in secrets + sources + ["data/weights.bin", "model.safetensors"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("API_KEY=sk-123\n")
    assert select_code_files(tmp_path, 1.0, []) == sorted(sources)


def test_log_upload_switches(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("telescope.log", "telescope.detailed.log", "worker.stdout.log"):
        (logs / name).write_text("x\n")
    pick = lambda **kw: [p.name for p in log_files_to_upload(tmp_path, **kw)]  # noqa: E731
    assert pick(logs=True, detailed=False, stdout=False) == ["telescope.log"]
    assert pick(logs=True, detailed=True, stdout=True) == [
        "telescope.detailed.log",
        "telescope.log",
        "worker.stdout.log",
    ]
    assert pick(logs=False, detailed=True, stdout=True) == []


def _inspect(run_path: Path) -> list[dict]:
    exe = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(exe), "leet", "inspect", "--json", str(run_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_offline_run_has_scalars_tables_code_logs_and_resumes(tmp_path, monkeypatch, make_rows) -> None:
    wandb_logger = pytest.importorskip("telescope.core.observe.loggers.wandb_logger")
    pytest.importorskip("wandb")
    for var, sub in (
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
    ):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    code_root, run_dir = tmp_path / "code", tmp_path / "run"
    _code_tree(code_root)
    cfg = make_config(
        use_wandb=True,
        wandb_project="proj",
        wandb_run_name="offline-test",
        wandb_tags=["t1"],
        wandb_code_max_file_size_mb=0.25,
        wandb_code_exclude_patterns=[".venv", "*.log"],
    )
    hub = LoggerHub([LocalLogger(), wandb_logger.WandbLogger(code_root=str(code_root))])
    hub.start(cfg, run_dir, system_metrics=False)
    for step in (1, 2):
        rows = make_rows(step)
        hub.log_rollouts(step, rows)
        hub.log_step(step, {**rollout_metrics(rows), "entropy": 0.5 * step})
        hub.event("trainer", "instant", step=step)
    hub.log_eval(2, "math", {"pass@1": 0.5}, [{"prompt": "1+1", "completion": "2", "reward": 1.0}])
    hub.log_info({"env_details": {"reverse_text": {"reward_min": 0.0}}})
    print("printed by the first run")
    ids = hub.run_ids()
    hub.finish("finished")
    assert not hub.failures, hub.failures

    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = _inspect(runs[0])
    run_rec = next(r["run"] for r in records if r["type"] == "run")
    assert run_rec["project"] == "proj" and run_rec["display_name"] == "offline-test"
    assert (
        run_rec["run_id"] == ids["wandb"]["id"]
        and "t1" in run_rec["tags"]
        and f"schema_version:{SCHEMA_VERSION}" in run_rec["tags"]
    )
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    scalars = [h for h in history if "reward/mean" in h]
    assert [h["_step"] for h in scalars] == [1, 2] and scalars[1]["entropy"] == 1.0
    assert {"discarded/zero_advantage/all_zero_groups", "rollouts/stop_reason_length_pct"} <= set(scalars[0])
    tables = sorted((runs[0] / "files" / "media" / "table").glob("rollouts_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ROLLOUT_TABLE_COLUMNS and len(table["data"]) == len(make_rows(1))
    code_paths = {
        c["path"]
        for r in records
        if r["type"] == "artifact" and r["artifact"]["type"] == "code"
        for c in r["artifact"]["manifest"]["contents"]
    }
    assert code_paths == {"pkg/train.py", "run.yaml"}
    assert (runs[0] / "files" / "logs" / "telescope.log").exists()
    evals = [h for h in history if "eval/math/pass@1" in h]
    assert [(h["_step"], h["eval/math/pass@1"]) for h in evals] == [(2, 0.5)]
    assert (
        len(list((runs[0] / "files" / "media" / "table" / "eval" / "math").glob("samples_*.table.json"))) == 1
    )
    uploaded = runs[0] / "files"
    events = read_jsonl(uploaded / "events" / "block_000000.jsonl.zst")
    assert [(e["type"], e["step"]) for e in events] == [("trainer", 1), ("trainer", 2), ("eval", 2)]
    assert events[2]["name"] == "math" and events[2]["attrs"] == {"scores": {"pass@1": 0.5}, "samples": 1}
    assert (uploaded / "events" / "tail.jsonl.zst").exists() and (
        uploaded / "rollouts" / "block_000000.jsonl.zst"
    ).exists()
    assert not (runs[0] / "files" / "logs" / "telescope.detailed.log").exists()
    # wandb_upload_logs_stdout is false by default: the local copy exists, the upload does not
    assert "printed by the first run" in (run_dir / "logs" / "telescope.stdout.log").read_text()
    assert not (runs[0] / "files" / "logs" / "telescope.stdout.log").exists()

    hub2 = LoggerHub([LocalLogger(), wandb_logger.WandbLogger(code_root=str(code_root))])
    cfg2 = cfg.model_copy(update={"wandb_upload_code": False, "wandb_upload_logs_stdout": True})
    hub2.start(cfg2, run_dir, ids, system_metrics=False)
    hub2.log_step(3, {"reward/mean": 0.9})
    print("printed by the resumed run")
    hub2.finish("finished")
    assert hub2.run_ids()["wandb"]["id"] == ids["wandb"]["id"]
    resumed = [p for p in (run_dir / "wandb").glob("offline-run-*") if p not in runs]
    # wandb appends "-1" to the folder name when both runs start within the same second.
    assert resumed and re.fullmatch(rf"offline-run-\d+_\d+-{ids['wandb']['id']}(-\d+)?", resumed[0].name)
    stdout_log = (resumed[0] / "files" / "logs" / "telescope.stdout.log").read_text()
    assert "printed by the first run" in stdout_log and "printed by the resumed run" in stdout_log
