"""Secrets of a run's config reach its workers, never its run directory, logs or output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from telescope.core.config import TelescopeConfig
from telescope.core.inference.launcher import InferenceEngine

from .rundriver import train_to_end

PLANTED_KEY = "sk-planted-9d31"
PLANTED_TOKEN = "hf-planted-5e02"
PLANTED_RUN_SECRET = "rs-planted-" + "7" * 40


def test_the_servers_config_file_holds_no_secret_and_still_loads(tmp_path: Path) -> None:
    """``logs/inference/resolved_config.json``: what every server reads, in the shared run dir."""
    provider = {"provider": "e2b", "provider_kwargs": {"api_key": PLANTED_KEY}}
    cfg = TelescopeConfig.model_validate(
        {
            "environments": [{"name": "reverse_text"}, {"name": "i3_code", "kwargs": provider}],
            "ray_runtime_env": {"env_vars": {"HF_TOKEN": PLANTED_TOKEN}},
        }
    )
    path = Path(InferenceEngine(cfg, None).write_config(tmp_path))
    text = path.read_text()
    assert PLANTED_KEY not in text and PLANTED_TOKEN not in text
    served = TelescopeConfig.model_validate(json.loads(text))  # what a server process does with it
    assert served.model == cfg.model and served.max_model_len == cfg.max_model_len
    assert served.environments[1].kwargs["provider_kwargs"] == {"api_key": "***"}


@pytest.mark.slow
def test_a_run_writes_no_planted_secret_anywhere_in_its_directory_or_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run (the CLI, Ray, a transformers server, FSDP) with a token in Ray's env vars and a
    fixed run secret: every file of the run directory, and the CLI's output, are searched; so is every
    file of the private Ray cluster's folder for the run secret (Ray logs the job's runtime_env: the
    user's env vars are there, in a folder only this user can open)."""
    monkeypatch.setenv("TELESCOPE_RUN_SECRET", PLANTED_RUN_SECRET)
    env_vars = {"HF_TOKEN": PLANTED_TOKEN, "PLANTED_API_KEY": PLANTED_KEY}
    run_dir = train_to_end(tmp_path, ray_runtime_env={"env_vars": env_vars})
    files = [p for p in [*run_dir.rglob("*"), tmp_path / "cli.log"] if p.is_file()]
    assert any(p.name == "resolved_config.json" for p in files)  # the file that held them in clear
    leaks = {
        str(p.relative_to(tmp_path)): secret
        for p in files
        for secret in (PLANTED_KEY, PLANTED_TOKEN, PLANTED_RUN_SECRET)
        if secret.encode() in p.read_bytes()
    }
    assert leaks == {}
    found = re.search(
        r"private Ray cluster .*its files and logs: (\S+)", (run_dir / "logs" / "telescope.log").read_text()
    )
    assert found is not None
    session = Path(found.group(1))
    ray_files = [p for p in session.rglob("*") if p.is_file()]
    assert [p for p in ray_files if PLANTED_RUN_SECRET.encode() in p.read_bytes()] == []
    assert session / "logs" / "runtime_env_agent.log" in [
        p for p in ray_files if PLANTED_TOKEN.encode() in p.read_bytes()
    ]
