"""``telescope envs list`` (the sub-app in telescope.cli.commands.envs)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from telescope.cli.commands.envs import app


def test_envs_list_json_describes_every_environment_and_eval() -> None:
    result = CliRunner().invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    entries = {e["name"]: e for e in json.loads(result.output)}
    assert entries["wordle"]["turns"] == "multi" and entries["countdown"]["turns"] == "single"
    assert entries["math500"]["kind"] == "eval"
    kwargs = {k["name"]: k for k in entries["countdown"]["kwargs"]}
    assert kwargs["num_generated"]["type"] == "int" and kwargs["num_generated"]["default"] == 1000
    assert kwargs["data_files"]["type"] == "str | list[str] | None"
    assert "procedural" in kwargs["num_generated"]["description"]
    assert entries["gsm8k"]["requires"] == ["math-verify"]


def test_envs_list_text() -> None:
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "calculator (multi-turn)" in result.output
    assert "max_turns: int (default 6)" in result.output  # wordle's own default
    assert "data_files: str | list[str] | None (default None)" in result.output  # markup escaped
