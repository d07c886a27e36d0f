"""A third-party environment package (examples/third_party_env) installed for real and
resolved by name from a run config.

The package is built and installed with pip into a private target directory (a real
``*.dist-info`` with the ``telescope`` entry point), then a fresh interpreter with that
directory on ``sys.path`` loads the plugins, validates a config and scores a completion.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from importlib.util import find_spec
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_env"

SCRIPT = r"""
import asyncio, sys
from telescope.core.config import load_config
from telescope.core.config.errors import ConfigError
from telescope.core.env import create_environment
from telescope.core.plugins import load_plugins

pset, registry = load_plugins()
info = pset.infos["example_env"]
assert info.distribution == "telescope-example-env", info
cfg_path = sys.argv[1]
cfg = load_config(cfg_path, registry=registry)
entry = cfg.environments[0]
env = create_environment(registry, entry.name, entry.kwargs)
samples = env.load_dataset()
assert len(samples) == 4 and env.name == "shout_reverse"
good = asyncio.run(env.score(samples[0].answer, samples[0])).total_reward
bad = asyncio.run(env.score("nope", samples[0])).total_reward
eos = asyncio.run(env.score(samples[0].answer + "<|im_end|>", samples[0], "<|im_end|>")).total_reward
try:
    load_config(cfg_path, {"environments": [{"name": "shout_reverse", "kwargs": {"num_sampels": 3}}]}, registry=registry)
    print("NO ERROR")
except ConfigError as exc:
    print("CONFIG ERROR:", exc)
print("REWARDS", good, bad, eos)
"""


def _install(source: Path, target: Path) -> None:
    """pip-install ``source`` into ``target``; without pip/setuptools (e.g. a uv venv), lay out
    the same files by hand: the package plus a ``*.dist-info`` with METADATA and entry points."""
    if find_spec("pip") is not None and find_spec("setuptools") is not None:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*cmd, "--target", str(target), str(source)], check=True)
        return
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    shutil.copytree(source / "src" / "telescope_example_env", target / "telescope_example_env")
    info = target / f"telescope_example_env-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = [f"{k} = {v}" for k, v in project["entry-points"]["telescope"].items()]
    (info / "entry_points.txt").write_text("[telescope]\n" + "\n".join(lines) + "\n")


def test_third_party_package_installs_and_resolves_from_config(tmp_path: Path) -> None:
    source = tmp_path / "src_copy"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp_path / "site"
    _install(source, target)
    entry_points = next(target.glob("telescope_example_env-*.dist-info")) / "entry_points.txt"
    assert "example_env = telescope_example_env.plugin" in entry_points.read_text()
    config = tmp_path / "run.yaml"
    config.write_text("environments:\n  - name: shout_reverse\n    kwargs: {num_samples: 4, seed: 2}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", SCRIPT, str(config)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REWARDS 1.0 0.0 1.0" in out.stdout  # the EOS rule: a stopped correct answer earns 1
    assert "CONFIG ERROR" in out.stdout and "num_sampels" in out.stdout
