"""Every code block of docs/environments.md runs.

Python blocks starting with ``# file: NAME`` are first written to a fresh project directory (the
working directory, first on ``sys.path``); the other blocks then run in order: Python in one
namespace. YAML blocks are validated as run configs (with their ``plugins``), the
``telescope ...`` lines of shell blocks run through the real CLI and must exit 0, and TOML blocks
must parse and declare a ``telescope`` entry point.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.cli.context import load_run

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # the doc's modules (puzzle_env, code_env, acme_plugin)
        if getattr(sys.modules[name], "__file__", "") and str(tmp_path) in str(sys.modules[name].__file__):
            del sys.modules[name]


def test_every_code_block_of_the_guide_runs(project: Path) -> None:
    kinds = [kind for kind, _ in blocks()]
    assert {"python", "yaml", "bash", "toml"} <= set(kinds), kinds
    namespace: dict[str, object] = {"__name__": "environments_doc"}
    ran = 0
    for kind, text in blocks():
        first = text.splitlines()[0]
        if kind == "python" and first.startswith("# file: "):
            (project / first.removeprefix("# file: ").strip()).write_text(text)
            ran += 1
    for kind, text in blocks():
        if kind == "python" and text.startswith("# file: "):
            continue
        if kind == "python":
            exec(compile(text, f"{DOC.name} block {ran}", "exec"), namespace)
        elif kind == "yaml":
            names = [e["name"] for e in yaml.safe_load(text)["environments"]]
            if "verifiers" in names and find_spec("verifiers") is None:
                continue  # verifiers lives in .venv-verifiers: test_verifiers_env.py validates this block
            (project / "run.yaml").write_text(text)
            run = load_run(project / "run.yaml", [])
            assert [e.name for e in run.cfg.environments] == names
        elif kind == "bash":
            for line in text.splitlines():
                args = shlex.split(line)
                assert args[0] == "telescope", line
                result = CliRunner().invoke(app, args[1:])
                assert result.exit_code == 0, (line, result.output)
                assert "every check passed" in result.output
        elif kind == "toml":
            assert "telescope" in tomllib.loads(text)["project"]["entry-points"]
        else:
            raise AssertionError(f"a {kind} block in {DOC.name}: teach this test to run it")
        ran += 1
    skipped = 0 if find_spec("verifiers") else 1
    assert ran + skipped == len(kinds)
