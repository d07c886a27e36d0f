"""A real separate distribution (a *.dist-info with entry_points.txt on sys.path) adds an environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = '''
"""Acme's Telescope plugin: one environment."""
from telescope.core import hookimpl
from telescope.core.env import SingleTurnKwargs


class PuzzleKwargs(SingleTurnKwargs):
    size: int = 3
    """Puzzle size."""


@hookimpl
def telescope_register_environments(register):
    register.add("acme_puzzle", "acme_envs.env:make", kwargs_model=PuzzleKwargs, description="Acme puzzles")
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    pkg = tmp_path / "acme_envs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(PLUGIN)
    (pkg / "env.py").write_text("def make(kwargs):\n    return ('acme', kwargs.size)\n")
    dist = tmp_path / "acme_envs-1.2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs\nVersion: 1.2.0\n")
    (dist / "entry_points.txt").write_text("[telescope]\nacme = acme_envs.plugin\n")
    return tmp_path


def run_cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    code = "import sys; from telescope.cli.app import main; sys.argv[0] = 'telescope'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)


def test_plugins_list_shows_third_party(site: Path) -> None:
    out = run_cli(site, "plugins", "list", "--json")
    assert out.returncode == 0, out.stderr
    listing = {p["plugin"]: p for p in json.loads(out.stdout)}
    acme = listing["acme"]
    assert acme["distribution"] == "acme-envs" and acme["version"] == "1.2.0"
    assert acme["components"]["environment"][0]["name"] == "acme_puzzle"


def test_config_naming_third_party_env_validates(site: Path, tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("environments:\n  - name: acme_puzzle\n    kwargs: {size: 5}\n")
    out = run_cli(site, "config", "validate", str(run))
    assert out.returncode == 0, out.stderr
    bad = run_cli(
        site, "config", "validate", str(run), "--environments", "[{name: acme_puzzle, kwargs: {sise: 5}}]"
    )
    assert bad.returncode == 2
    assert "environments[0].kwargs.sise" in bad.stderr


def test_third_party_blocked(site: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(site), TELESCOPE_DISABLE_PLUGINS="acme")
    code = "import json; from telescope.cli.commands.plugins import plugin_listing; print(json.dumps(plugin_listing()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "acme" not in {p["plugin"] for p in json.loads(out.stdout)}
