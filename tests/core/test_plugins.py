"""Plugin manager factory: order, blocking, provenance, duplicates, lazy factories."""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from telescope.core import hookimpl
from telescope.core.plugins import BUILTIN_PLUGINS, PluginLoadError, build_registry, get_plugin_manager
from telescope.core.registry import DuplicateComponentError, PluginInfo, UnknownComponentError
from telescope.core.testing import registry_with


class Kw(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = 2


def make_env_plugin(name: str, env_name: str, factory: object = "json:dumps"):  # type: ignore[no-untyped-def]
    class P:
        @hookimpl
        def telescope_register_environments(self, register):  # type: ignore[no-untyped-def]
            register.add(env_name, factory, kwargs_model=Kw, description=f"from {name}")

    return P()


def test_builtins_first_in_fixed_order() -> None:
    pset = get_plugin_manager()
    names = pset.names
    assert names[: len(BUILTIN_PLUGINS)] == [n for n, _ in BUILTIN_PLUGINS]
    third_party = names[len(BUILTIN_PLUGINS) :]
    assert third_party == sorted(third_party)


def test_installed_first_party_plugins_load() -> None:
    pset = get_plugin_manager()
    for name in ("fsdp", "envs", "sandboxes", "megatron"):
        assert name in pset.names
        assert pset.infos[name].distribution == f"telescope-{name}"


def test_disable_plugins_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELESCOPE_DISABLE_PLUGINS", "megatron, sandboxes")
    pset = get_plugin_manager()
    assert "megatron" not in pset.names and "sandboxes" not in pset.names
    assert sorted(pset.blocked) == ["megatron", "sandboxes"]
    assert not build_registry(pset).has("trainer_backend", "megatron")


def test_only_loads_exactly_the_driver_set() -> None:
    pset = get_plugin_manager(only=["core.algorithms", "megatron"])
    assert pset.names == ["core.algorithms", "megatron"]
    with pytest.raises(PluginLoadError, match="not installed"):
        get_plugin_manager(only=["core.algorithms", "no-such-plugin"])


def test_duplicate_component_names_both_distributions() -> None:
    pset = get_plugin_manager(load_entrypoints=False)
    for name, dist in (("a", "dist-one"), ("b", "dist-two")):
        pset.pm.register(make_env_plugin(name, "same"), name=name)
        pset.infos[name] = PluginInfo(name, "m", dist, "1.0")
    with pytest.raises(DuplicateComponentError) as err:
        build_registry(pset)
    assert "dist-one" in str(err.value) and "dist-two" in str(err.value)
    assert "TELESCOPE_DISABLE_PLUGINS" in str(err.value)


def test_provenance_and_lazy_factory() -> None:
    mod = types.ModuleType("telescope_test_lazy_target")
    mod.build = lambda kwargs: ("built", kwargs.size)  # type: ignore[attr-defined]
    _, registry = registry_with(("p1", make_env_plugin("p1", "lazy", "telescope_test_lazy_target:build")))
    comp = registry.get("environment", "lazy")
    assert comp.plugin.name == "p1" and comp.description == "from p1"
    with pytest.raises(ModuleNotFoundError):  # not imported at registration time
        comp.load_factory()
    sys.modules["telescope_test_lazy_target"] = mod
    try:
        assert comp.create({"size": 5}) == ("built", 5)
        with pytest.raises(ValidationError):
            comp.create({"size": "big"})
    finally:
        del sys.modules["telescope_test_lazy_target"]


def test_unknown_component_lists_and_suggests() -> None:
    _, registry = registry_with(("p1", make_env_plugin("p1", "countdown")))
    with pytest.raises(UnknownComponentError) as err:
        registry.get("environment", "countdwn")
    assert "Did you mean 'countdown'" in str(err.value) and "Registered: countdown" in str(err.value)


def test_broken_plugin_named_in_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import telescope.core.plugins as plugins

    monkeypatch.setattr(plugins, "BUILTIN_PLUGINS", (("core.broken", "telescope.core.no_such_module"),))
    with pytest.raises(PluginLoadError) as err:
        get_plugin_manager(load_entrypoints=False)
    assert "core.broken" in str(err.value) and "TELESCOPE_DISABLE_PLUGINS=core.broken" in str(err.value)


def test_bad_factory_string_rejected() -> None:
    with pytest.raises(ValueError, match="module:attribute"):
        registry_with(("p1", make_env_plugin("p1", "x", "no_colon_here")))
