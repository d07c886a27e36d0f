"""Config-time checks of environments: the kwargs model's base class, nested provider kwargs.

The README's plugin snippet is taken from README.md itself and registered for real; a copy
whose kwargs model derives from plain ``BaseModel`` (the old snippet) must be refused by
``config validate`` with a message naming the fix.
"""

from __future__ import annotations

import linecache
import re
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from telescope.core.config import load_config
from telescope.core.config.errors import ConfigError
from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, create_environment
from telescope.core.plugins import build_registry, get_plugin_manager
from telescope.core.registry import PluginInfo

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_plugin_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "telescope_register_environments" in b]
    return block


class PuzzleEnvironment(SingleTurnEnvironment):
    """The environment the README snippet's factory string points at (defined here)."""

    kwargs_model: ClassVar[Any] = None  # set per test to the snippet's kwargs model

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("2+2", "4")]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(float(completion.strip() == sample.answer))


def _plugin(source: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The snippet as a module; ``acme_envs.env`` (its factory's module) is this test module's class."""
    module = types.ModuleType("acme_envs.plugin")
    # A name of its own, its source in linecache: pydantic reads field docstrings through
    # inspect, which would otherwise read README.md's lines at the snippet's line numbers.
    filename = "<README.md plugin snippet>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    env_module = types.ModuleType("acme_envs.env")
    env_module.PuzzleEnvironment = PuzzleEnvironment  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "acme_envs", types.ModuleType("acme_envs"))
    monkeypatch.setitem(sys.modules, "acme_envs.env", env_module)
    PuzzleEnvironment.kwargs_model = module.PuzzleKwargs
    return module


def registry_with(plugin: types.ModuleType) -> Any:
    """The installed plugins plus ``plugin`` (registered under the name 'acme')."""
    pset = get_plugin_manager()
    pset.pm.register(plugin, name="acme")
    pset.infos["acme"] = PluginInfo("acme", plugin.__name__, "tests", "0")
    return build_registry(pset)


def _config(registry: Any, **kwargs: Any) -> Any:
    return load_config(None, {"environments": [{"name": "acme_puzzle", "kwargs": kwargs}]}, registry=registry)


def test_readme_snippet_validates_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _plugin(_readme_plugin_source(), monkeypatch)
    registry = registry_with(module)
    cfg = _config(registry, size=5)
    env = create_environment(registry, "acme_puzzle", cfg.environments[0].kwargs)
    assert env.system_prompt is None and env.kwargs.size == 5 and env.kwargs.reward_timeout_s == 60.0
    import asyncio

    assert asyncio.run(env.score("4", env.get_sample(0))).total_reward == 1.0


def test_kwargs_model_not_deriving_from_environment_kwargs_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = _readme_plugin_source()
    old = source.replace("from telescope.core.env import SingleTurnKwargs", "from pydantic import BaseModel")
    old = old.replace("class PuzzleKwargs(SingleTurnKwargs)", "class PuzzleKwargs(BaseModel)")
    assert "BaseModel)" in old
    module = _plugin(old, monkeypatch)
    registry = registry_with(module)
    with pytest.raises(ConfigError) as err:
        _config(registry, size=5)
    message = str(err.value)
    assert "environments[0]" in message and "PuzzleKwargs" in message
    assert "must subclass telescope.core.env.EnvironmentKwargs" in message and "SingleTurnKwargs" in message
    with pytest.raises(ValueError, match="must subclass"):
        create_environment(registry, "acme_puzzle", {"size": 5})


def test_misspelled_factory_and_kwargs_get_a_did_you_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _readme_plugin_source().replace(
        "acme_envs.env:PuzzleEnvironment", "acme_envs.env:PuzzelEnvironment"
    )
    registry = registry_with(_plugin(source, monkeypatch))
    with pytest.raises(ConfigError) as err:
        _config(registry, size=5)
    assert (
        "factory 'acme_envs.env:PuzzelEnvironment': module 'acme_envs.env' has no 'PuzzelEnvironment'. "
        "Did you mean 'PuzzleEnvironment'?" in str(err.value)
    )
    registry = registry_with(_plugin(_readme_plugin_source(), monkeypatch))
    with pytest.raises(ConfigError) as err:
        _config(registry, szie=5)
    assert "environments[0].kwargs.szie: unknown field. Did you mean 'size'?" in str(err.value)
