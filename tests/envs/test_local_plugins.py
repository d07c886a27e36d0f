"""Plugins from local files: the config's ``plugins:`` and ``-p FILE`` load a Python file the way
pytest loads a conftest; the driver's plugin names make a worker process load the same file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.cli.context import load_run
from telescope.core.plugins import PluginLoadError, load_plugins, local_plugin_name

PLUGIN = '''
from telescope.core import hookimpl
from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from helper_words import WORDS  # a sibling module: the file's directory is on sys.path


class EchoKwargs(SingleTurnKwargs):
    count: int = 2
    """Number of samples."""


class EchoEnvironment(SingleTurnEnvironment):
    kwargs_model = EchoKwargs

    def load_dataset(self, num_samples=-1):
        self._samples = [Sample(f"say {w}", w) for w in WORDS[: self.kwargs.count]]
        return self._samples

    def reference_completion(self, sample):
        return sample.answer

    async def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(float(completion.strip() == sample.answer))


@hookimpl
def telescope_register_environments(register):
    register.add("echo_words", "echo_env:EchoEnvironment", kwargs_model=EchoKwargs, description="echo")
'''

WORKER = """
import asyncio, json, sys
from telescope.core.runtime.workers import _load
cfg, registry = _load(json.loads(sys.argv[1]), json.loads(sys.argv[2]))
env = registry.create("environment", "echo_words", {"count": 2})
sample = env.load_dataset()[1]
print("REWARD", asyncio.run(env.score(sample.answer + "<|im_end|>", sample, "<|im_end|>")).total_reward)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory with a plugin file and a sibling module; both are forgotten afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "echo_env.py").write_text(PLUGIN)
    (tmp_path / "envs" / "helper_words.py").write_text("WORDS = ['alpha', 'beta', 'gamma']\n")
    (tmp_path / "run.yaml").write_text(
        "plugins: [envs/echo_env.py]\nenvironments:\n  - name: echo_words\n    kwargs: {count: 2}\n"
    )
    yield tmp_path
    for module in ("echo_env", "helper_words", "broken_env"):
        sys.modules.pop(module, None)


def test_config_plugins_load_and_reach_a_worker_process(project: Path, tmp_path: Path) -> None:
    run = load_run(project / "run.yaml", [])  # relative to the config file, not the working directory
    name = f"file:{project / 'envs' / 'echo_env.py'}"
    assert run.cfg.plugins == [name] and run.pset.names[-1] == name
    assert run.pset.infos[name].distribution == "local file"
    env = run.registry.create("environment", "echo_words", {"count": 2})
    assert [s.answer for s in env.load_dataset()] == ["alpha", "beta"]
    # A worker is another interpreter in another directory: it gets the config and the names.
    out = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(run.cfg.to_dict()), json.dumps(run.pset.names)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path.parent,
    )
    assert out.returncode == 0, out.stderr
    assert "REWARD 1.0" in out.stdout


def test_cli_flag_loads_a_file_and_bad_specs_are_clear(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    (project / "bare.yaml").write_text("environments:\n  - name: echo_words\n")
    result = CliRunner().invoke(app, ["config", "validate", "bare.yaml", "-p", "envs/echo_env.py"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["config", "validate", "bare.yaml"])
    assert result.exit_code == 2 and "unknown environment 'echo_words'" in result.output
    checked = CliRunner().invoke(app, ["env", "check", "echo_words", "-p", "envs/echo_env.py"])
    assert checked.exit_code == 0, checked.output
    assert "ok   reference 'alpha' scored 1" in checked.output
    with pytest.raises(PluginLoadError, match="plugin file 'envs/nope.py' does not exist"):
        local_plugin_name("envs/nope.py")
    assert local_plugin_name("acme_envs.plugin") == "module:acme_envs.plugin"
    (project / "envs" / "broken_env.py").write_text("raise RuntimeError('typo in my plugin')\n")
    with pytest.raises(PluginLoadError, match="typo in my plugin"):
        load_plugins(files=["envs/broken_env.py"])
