"""Contracts of the plugin surface: hooks documented and exercised, light imports, components valid."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from telescope.core import hookimpl, hookspecs
from telescope.core.plugins import get_plugin_manager, load_plugins
from telescope.core.registry import KINDS
from telescope.core.testing import heavy_imports_after

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("telescope_") and inspect.isfunction(f))
HEAVY = ("torch", "ray", "transformers", "vllm")


def test_hook_set() -> None:
    registration = {
        f"telescope_register_{k}"
        for k in (
            "algorithms",
            "trainer_backends",
            "inference_engines",
            "environments",
            "evals",
            "sandbox_providers",
            "loggers",
        )
    }
    run = {
        "telescope_run_start",
        "telescope_run_info",
        "telescope_group_end",
        "telescope_events",
        "telescope_step_end",
        "telescope_eval_end",
        "telescope_system_sample",
        "telescope_warning",
        "telescope_run_end",
    }
    assert registration | run == set(HOOKS)
    assert len(registration) == len(KINDS)


@pytest.mark.parametrize("name", HOOKS)
def test_hook_documented(name: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert len(doc.splitlines()[0]) > 10, f"{name} needs a summary line"
    params = [p for p in inspect.signature(getattr(hookspecs, name)).parameters]
    for param in params:
        assert f"{param}:" in doc, f"{name}: argument '{param}' is not documented"


class RecorderPlugin:
    """Implements every hook explicitly and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def _reg(self, name: str, register: object) -> None:
        self.calls.append((name, {"register": register}))

    @hookimpl
    def telescope_register_algorithms(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_algorithms", register)

    @hookimpl
    def telescope_register_trainer_backends(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_trainer_backends", register)

    @hookimpl
    def telescope_register_inference_engines(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_inference_engines", register)

    @hookimpl
    def telescope_register_environments(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_environments", register)

    @hookimpl
    def telescope_register_evals(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_evals", register)

    @hookimpl
    def telescope_register_sandbox_providers(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_sandbox_providers", register)

    @hookimpl
    def telescope_register_loggers(self, register):  # type: ignore[no-untyped-def]
        self._reg("telescope_register_loggers", register)

    @hookimpl
    def telescope_run_start(self, config, run_dir):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_run_start", {"config": config, "run_dir": run_dir}))

    @hookimpl
    def telescope_run_info(self, info):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_run_info", {"info": info}))

    @hookimpl
    def telescope_group_end(self, group, step):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_group_end", {"group": group, "step": step}))

    @hookimpl
    def telescope_events(self, events):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_events", {"events": events}))

    @hookimpl
    def telescope_step_end(self, step, metrics):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_step_end", {"step": step, "metrics": metrics}))

    @hookimpl
    def telescope_eval_end(self, step, name, metrics, rows):  # type: ignore[no-untyped-def]
        self.calls.append(
            ("telescope_eval_end", {"step": step, "name": name, "metrics": metrics, "rows": rows})
        )

    @hookimpl
    def telescope_system_sample(self, sample):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_system_sample", {"sample": sample}))

    @hookimpl
    def telescope_warning(self, message):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_warning", {"message": message}))

    @hookimpl
    def telescope_run_end(self, status, error):  # type: ignore[no-untyped-def]
        self.calls.append(("telescope_run_end", {"status": status, "error": error}))


def test_every_hook_is_called() -> None:
    from telescope.core.plugins import build_registry
    from telescope.core.registry import PluginInfo

    rec = RecorderPlugin()
    calls = rec.calls
    pset = get_plugin_manager(load_entrypoints=False)
    pset.pm.register(rec, name="rec")
    pset.infos["rec"] = PluginInfo("rec", "tests", "tests", "0")
    build_registry(pset)
    pset.pm.hook.telescope_run_start(config={"x": 1}, run_dir="/tmp/run")
    pset.pm.hook.telescope_run_info(info={"setup": {}})
    pset.pm.hook.telescope_group_end(group="g", step=1)
    pset.pm.hook.telescope_events(events=["e"])
    pset.pm.hook.telescope_step_end(step=1, metrics={"loss": 0.5}, rollouts=[])
    pset.pm.hook.telescope_eval_end(step=1, name="math", metrics={"pass@1": 1.0}, rows=[])
    pset.pm.hook.telescope_system_sample(sample={"source": "system", "metrics": {}})
    pset.pm.hook.telescope_warning(message="careful")
    pset.pm.hook.telescope_run_end(status="completed", error=None)
    called = {name for name, _ in calls}
    assert called == set(HOOKS)
    kinds = [c[1]["register"].kind for c in calls if c[0].startswith("telescope_register_")]  # type: ignore[attr-defined]
    assert kinds == list(KINDS)
    assert ("telescope_step_end", {"step": 1, "metrics": {"loss": 0.5}}) in calls


def test_core_and_plugin_modules_import_light() -> None:
    code = (
        "import telescope.core, telescope.core.config, telescope.core.plugins, telescope.core.testing\n"
        "from telescope.core.plugins import load_plugins\n"
        "pset, reg = load_plugins()\n"
        "import telescope.cli.app\n"
    )
    assert heavy_imports_after(code, HEAVY) == []


def test_namespace_package_has_no_init() -> None:
    packages = sorted(ROOT.glob("telescope-*/src/telescope"))
    assert len(packages) == 6
    for pkg in packages:
        assert not (pkg / "__init__.py").exists(), f"{pkg}/__init__.py breaks the namespace package"


def test_every_component_valid() -> None:
    _, registry = load_plugins()
    for comp in registry.components():
        assert comp.description, f"{comp.kind} {comp.name} has no description"
        if not comp.available:
            continue
        comp.load_factory()  # the lazy import string resolves
        if comp.kwargs_model is not None:
            for field, info in comp.kwargs_model.model_fields.items():
                assert info.description, f"{comp.kind} {comp.name}: kwargs field '{field}' undocumented"
            comp.validate_kwargs(comp.meta.get("example_kwargs", {}))
