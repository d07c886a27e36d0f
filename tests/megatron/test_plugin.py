"""The ``megatron`` backend registers everywhere; it is unavailable (with the reason) where it cannot run."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from telescope.core.config.validate import registry_problems
from telescope.core.testing import heavy_imports_after, make_config, registry_with
from telescope.megatron import plugin
from telescope.megatron.availability import unavailable_reason
from telescope.megatron.options import MegatronBackendKwargs


def _spec_found(name: str) -> object:
    return object()


def _no_spec(name: str) -> None:
    return None


def test_old_python_is_the_reason() -> None:
    reason = unavailable_reason((3, 11, 7), _spec_found, lambda _: "0.19.2")
    assert reason is not None
    assert "requires Python >= 3.12 but this is Python 3.11.7" in reason
    assert "pip install megatron-core" in reason


def test_missing_package_gives_the_pip_command() -> None:
    reason = unavailable_reason((3, 12, 3), _no_spec, lambda _: "0.19.2")
    assert reason is not None and reason.startswith("megatron-core is not installed: pip install")


def test_missing_parent_package_counts_as_missing() -> None:
    def raising(name: str) -> None:
        raise ModuleNotFoundError("No module named 'megatron'")

    assert "not installed" in (unavailable_reason((3, 12, 0), raising, lambda _: "0.19.2") or "")


def test_versions() -> None:
    assert "too old" in (unavailable_reason((3, 12, 0), _spec_found, lambda _: "0.18.1") or "")
    assert unavailable_reason((3, 13, 0), _spec_found, lambda _: "0.19.2") is None
    assert unavailable_reason((3, 12, 0), _spec_found, lambda _: "0.20.0rc1") is None

    def not_a_dist(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    assert unavailable_reason((3, 12, 0), _spec_found, not_a_dist) is None  # source checkout


def test_registry_lists_it_with_this_interpreters_reason() -> None:
    _, registry = registry_with(("telescope-megatron", plugin))
    component = registry.get("trainer_backend", "megatron")
    assert component.unavailable == unavailable_reason()
    if sys.version_info < (3, 12):
        assert not component.available and "Python >= 3.12" in (component.unavailable or "")
    assert component.kwargs_model is MegatronBackendKwargs


@pytest.mark.skipif(unavailable_reason() is None, reason="megatron-core is usable here")
def test_selecting_it_is_a_config_error() -> None:
    _, registry = registry_with(("telescope-megatron", plugin))
    problems = registry_problems(make_config(train_backend="megatron"), registry)
    assert any(p.startswith("train_backend: 'megatron'") and "unavailable" in p for p in problems)


def test_installed_entry_point_registers_megatron() -> None:
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="telescope")}
    assert eps.get("megatron") == "telescope.megatron.plugin"


def test_plugin_import_is_light() -> None:
    code = "import telescope.megatron.plugin, telescope.megatron.parallel"
    assert heavy_imports_after(code, ("torch", "megatron", "transformers")) == []


def test_kwargs_model_rejects_unknown_fields() -> None:
    assert MegatronBackendKwargs().adam_beta2 == 0.999
    with pytest.raises(ValueError, match="extra"):
        MegatronBackendKwargs(adam_beta3=0.5)  # type: ignore[call-arg]
