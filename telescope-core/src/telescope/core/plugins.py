"""Plugin manager factory and registry construction.

Order is fixed and never depends on installation order: core built-ins first (in
``BUILTIN_PLUGINS`` order), then entry points of the ``telescope`` group sorted by name, then
local plugins (the config's ``plugins:`` and ``telescope train -p``) in the order given.

A local plugin is a Python file (``my_env.py``, imported under its stem with its directory put
first on ``sys.path``, like pytest's conftest files, so ``"my_env:MyEnv"`` factories resolve) or
an importable module name. It is named ``file:/absolute/path.py`` or ``module:name``; that name is
in ``PluginSet.names``, so Ray workers (``load_plugins(only=names)``) load the same files.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pluggy

from telescope.core import hookspecs
from telescope.core.registry import KINDS, PluginInfo, Register, Registry

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PluginLoadError",
    "PluginSet",
    "build_registry",
    "get_plugin_manager",
    "load_plugins",
    "local_plugin_name",
]

ENTRY_POINT_GROUP = "telescope"

#: Core's own plugins: (plugin name, module). They register through the same hooks as
#: third-party plugins do, before any entry point.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("core.algorithms", "telescope.core.builtin.algorithms"),
    ("core.engines", "telescope.core.builtin.engines"),
    ("core.loggers", "telescope.core.builtin.loggers"),
)

_REGISTER_HOOKS = {
    "algorithm": "telescope_register_algorithms",
    "trainer_backend": "telescope_register_trainer_backends",
    "inference_engine": "telescope_register_inference_engines",
    "environment": "telescope_register_environments",
    "eval": "telescope_register_evals",
    "sandbox_provider": "telescope_register_sandbox_providers",
    "logger": "telescope_register_loggers",
}


class PluginLoadError(RuntimeError):
    """An installed plugin could not be imported or registered."""


@dataclass
class PluginSet:
    """A resolved plugin manager plus where each plugin came from."""

    pm: pluggy.PluginManager
    infos: dict[str, PluginInfo] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Plugin names in load order (what workers must load to match the driver)."""
        return list(self.infos)


def _core_version() -> str:
    try:
        return metadata.version("telescope-core")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _blocked_from_env() -> set[str]:
    raw = os.environ.get("TELESCOPE_DISABLE_PLUGINS", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def _entry_points() -> list[metadata.EntryPoint]:
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    seen: dict[str, metadata.EntryPoint] = {}
    for ep in sorted(eps, key=lambda e: (e.name, e.value)):
        prev = seen.get(ep.name)
        if prev is not None and prev.value != ep.value:
            raise PluginLoadError(
                f"two installed distributions declare the telescope plugin '{ep.name}': "
                f"{_dist_name(prev)} ({prev.value}) and {_dist_name(ep)} ({ep.value}). "
                f"Uninstall one, or block it with TELESCOPE_DISABLE_PLUGINS={ep.name}."
            )
        seen[ep.name] = ep
    return list(seen.values())


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else "<unknown distribution>"


def _dist_version(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.version if dist is not None else "0+unknown"


_LOCAL_KINDS = ("file:", "module:")


def local_plugin_name(spec: str, base: str | Path | None = None) -> str:
    """``file:/abs/path.py`` for a Python file (relative to ``base``, else the working directory),
    ``module:name`` for a module name; an already-named spec is returned unchanged."""
    if spec.startswith(_LOCAL_KINDS):
        return spec
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        path = (Path(base or ".") / spec).resolve()
        if not path.is_file():
            raise PluginLoadError(f"plugin file {spec!r} does not exist (looked for {path})")
        return f"file:{path}"
    return f"module:{spec}"


def _import_local(info: PluginInfo) -> object:
    if info.name.startswith("module:"):
        return importlib.import_module(info.module)
    path = Path(info.module)
    directory, stem = str(path.parent), path.stem
    if directory not in sys.path:
        sys.path.insert(0, directory)  # siblings import, and "stem:Class" factories resolve
    loaded = sys.modules.get(stem)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ImportError(
            f"a module named '{stem}' is already imported from {loaded.__file__}; rename the file"
        )
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[stem]
        raise
    return module


def get_plugin_manager(
    *,
    load_entrypoints: bool = True,
    only: Iterable[str] | None = None,
    block: Iterable[str] = (),
    files: Iterable[str] = (),
) -> PluginSet:
    """Build a fresh plugin manager (there is no global one).

    Args:
        load_entrypoints: also load third-party plugins from the ``telescope`` entry-point group.
        only: load exactly these plugin names (what a Ray worker gets from the driver); a name
            that is not installed is an error.
        block: plugin names never to load, added to ``TELESCOPE_DISABLE_PLUGINS``.
        files: local plugins: Python files or module names (see the module docstring).
    """
    pm = pluggy.PluginManager("telescope")
    pm.add_hookspecs(hookspecs)
    blocked = _blocked_from_env() | set(block)
    wanted = None if only is None else list(only)
    pset = PluginSet(pm=pm)
    candidates: list[tuple[str, str, str, str]] = [
        (name, module, "telescope-core", _core_version()) for name, module in BUILTIN_PLUGINS
    ]
    if load_entrypoints or wanted is not None:
        candidates += [(ep.name, ep.value, _dist_name(ep), _dist_version(ep)) for ep in _entry_points()]
    local = [local_plugin_name(f) for f in files] + [n for n in wanted or [] if n.startswith(_LOCAL_KINDS)]
    candidates += [
        (n, n.partition(":")[2], f"local {n.partition(':')[0]}", "0") for n in dict.fromkeys(local)
    ]
    available = {c[0] for c in candidates}
    if wanted is not None:
        missing = [n for n in wanted if n not in available]
        if missing:
            raise PluginLoadError(
                f"plugins {missing} are required (the driver loaded them) but are not installed "
                "in this environment: install the same packages on every node."
            )
    for name, module, dist, version in candidates:
        if name in blocked or (wanted is not None and name not in wanted):
            if name in blocked:
                pset.blocked.append(name)
            continue
        _register_module(pset, PluginInfo(name, module, dist, version))
    pm.check_pending()
    return pset


def _register_module(pset: PluginSet, info: PluginInfo) -> None:
    try:
        local = info.name.startswith(_LOCAL_KINDS)
        module = _import_local(info) if local else importlib.import_module(info.module)
        pset.pm.register(module, name=info.name)
    except Exception as exc:
        raise PluginLoadError(
            f"plugin '{info.name}' from {info.distribution} {info.version} failed to load "
            f"({info.module}): {type(exc).__name__}: {exc}. Reinstall it, or skip it with "
            f"TELESCOPE_DISABLE_PLUGINS={info.name}."
        ) from exc
    pset.infos[info.name] = info


def build_registry(pset: PluginSet) -> Registry:
    """Call every registration hook, plugin by plugin in load order, into a new registry."""
    registry = Registry()
    order = {name: i for i, name in enumerate(pset.infos)}
    for kind in KINDS:
        hook = getattr(pset.pm.hook, _REGISTER_HOOKS[kind])
        impls = sorted(hook.get_hookimpls(), key=lambda impl: order[impl.plugin_name])
        for impl in impls:
            register = Register(registry, kind, pset.infos[impl.plugin_name])
            impl.function(register=register)
    return registry


def load_plugins(
    *, only: Iterable[str] | None = None, block: Iterable[str] = (), files: Iterable[str] = ()
) -> tuple[PluginSet, Registry]:
    """Convenience: ``get_plugin_manager`` then ``build_registry``."""
    pset = get_plugin_manager(only=only, block=block, files=files)
    return pset, build_registry(pset)
