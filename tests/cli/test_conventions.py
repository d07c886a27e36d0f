"""Conventions every ``telescope`` command shares, checked over the whole command tree: ``-h``,
shell completion, flags without a ``<bool>`` placeholder, snake_case options, ``--debug`` as the
config field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from telescope.cli.app import app

runner = CliRunner()
#: Typer's own completion options: the one place kebab-case stays (typer names them).
TYPER_OWN = {"--install-completion", "--show-completion"}


def command_paths() -> Iterator[list[str]]:
    """Every command and group of the app, as the words a user types."""
    root = typer.main.get_command(app)

    def walk(cmd: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                yield from walk(sub, [*path, name])

    yield from walk(root, [])


PATHS = list(command_paths())


def test_the_tree_is_walked() -> None:
    assert ["runs", "show"] in PATHS and ["train"] in PATHS and ["config", "validate"] in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "telescope")
def test_dash_h_is_help_and_flags_have_no_bool_placeholder(path: list[str]) -> None:
    short = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "200"})
    long = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert short.exit_code == 0 and short.stdout == long.stdout and "Usage: " in short.stdout
    assert "<bool>" not in short.stdout


def test_options_are_snake_case_with_the_old_spelling_accepted() -> None:
    root = typer.main.get_command(app)
    seen = []

    def walk(cmd: object) -> None:
        for param in getattr(cmd, "params", []):
            longs = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
            if longs and longs[0] not in TYPER_OWN:
                seen.append(longs[0])
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(root)
    assert "--dry_run" in seen and "--reward_key" in seen
    assert [o for o in seen if "-" in o[2:]] == []


def test_shell_completion_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    # typer finds the user's shell among the parent processes (shellingham); a test run started
    # outside any shell (a detached job) has none, so the detection is pinned to bash here
    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
    assert "--install-completion" in runner.invoke(app, ["-h"], env={"COLUMNS": "200"}).stdout
    script = runner.invoke(app, ["--show-completion"], prog_name="telescope")
    assert script.exit_code == 0 and "_TELESCOPE_COMPLETE=complete_bash" in script.stdout, (
        script.output,
        script.exception,
    )


def test_kebab_spelling_still_works(tmp_path: Path) -> None:
    result = runner.invoke(app, ["runs", "show", str(tmp_path), "--reward-key", "x"])
    assert result.exit_code == 2 and "run.json is missing" in result.output  # parsed, then the dir checked


@pytest.fixture
def run_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"environments": [{"name": "reverse_text"}]}))
    return path


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ([], False),
        (["--debug"], True),
        (["--debug", "true"], True),
        (["--debug", "false"], False),
        (["--debug=false"], False),
        (["--debug", "--seed", "3"], True),
    ],
)
def test_debug_is_the_config_field(run_yaml: Path, args: list[str], want: bool) -> None:
    result = runner.invoke(app, ["config", "show", str(run_yaml), *args])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["debug"] is want


def test_debug_shows_the_traceback_of_a_config_error(run_yaml: Path) -> None:
    plain = runner.invoke(app, ["config", "validate", str(run_yaml), "--seed", "x"])
    debug = runner.invoke(app, ["config", "validate", str(run_yaml), "--seed", "x", "--debug"])
    assert plain.exit_code == debug.exit_code == 2 and "seed" in plain.output
    assert "Traceback" not in plain.output and "run with --debug" in plain.output
    assert "Traceback" in debug.output
