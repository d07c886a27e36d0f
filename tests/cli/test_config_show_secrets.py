"""``telescope config show`` prints no secret, with or without ``--sources``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from telescope.cli.app import app

PLANTED = {"api_key": "sk-planted-4c1e", "token": "hf-planted-77aa"}


def config_with_planted_secrets(tmp_path: Path) -> Path:
    """A valid run config carrying one secret in a sandbox provider's kwargs, one in Ray's env vars."""
    path = tmp_path / "run.yaml"
    provider = {"provider": "e2b", "provider_kwargs": {"api_key": PLANTED["api_key"]}}
    path.write_text(
        yaml.safe_dump(
            {
                "environments": [{"name": "reverse_text"}, {"name": "i3_code", "kwargs": provider}],
                "ray_runtime_env": {"env_vars": {"HF_TOKEN": PLANTED["token"], "LANG": "C"}},
            }
        )
    )
    return path


@pytest.mark.parametrize("extra", [[], ["--sources"]])
def test_config_show_prints_no_planted_secret(tmp_path: Path, extra: list[str]) -> None:
    result = CliRunner().invoke(app, ["config", "show", str(config_with_planted_secrets(tmp_path)), *extra])
    assert result.exit_code == 0, result.output
    for secret in PLANTED.values():
        assert secret not in result.output
    shown = yaml.safe_load(result.stdout)  # still YAML, the redaction visible where the secret was
    assert shown["environments"][1]["kwargs"]["provider_kwargs"] == {"api_key": "***"}
    assert shown["ray_runtime_env"] == {"env_vars": {"HF_TOKEN": "***", "LANG": "C"}}
