"""Calling a run hook plugin by plugin, so one plugin's error neither hides the others' calls nor the run's.

At the end of a run (``telescope_run_end``, the failure's ``telescope_run_info``) every plugin
must hear how the run ended even when one of them raises, and a plugin's error must not take
the place of the run's own: pluggy stops at the first implementation that raises and
propagates its error, so these hooks are called one implementation at a time instead.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.errors import describe_failure

if TYPE_CHECKING:
    import pluggy

__all__ = ["HookFailure", "call_each"]


@dataclass(frozen=True)
class HookFailure:
    """One plugin's implementation of a hook raised."""

    hook: str
    """The hook's name, e.g. ``telescope_run_end``."""
    plugin: str
    """The plugin's name in the plugin manager (``file:/path/watch.py``, an entry point's name)."""
    error: BaseException

    def describe(self) -> str:
        """``the telescope_run_end hook of plugin 'watch' failed: RuntimeError: boom``."""
        return f"the {self.hook} hook of plugin {self.plugin!r} failed: {describe_failure(self.error)}"

    def record(self) -> dict[str, str]:
        """What ``run.json`` keeps of it."""
        return {"hook": self.hook, "plugin": self.plugin, "error": describe_failure(self.error)}


def call_each(
    pm: pluggy.PluginManager, name: str, kwargs: Mapping[str, Any], skip: Container[str] = ()
) -> list[HookFailure]:
    """Call every implementation of the hook ``name`` (in pluggy's order) but those of the plugins in
    ``skip``, each on its own; returns the failures instead of raising the first (``Exception`` only:
    Ctrl-C still stops the run's end)."""
    impls = getattr(pm.hook, name).get_hookimpls()
    failures: list[HookFailure] = []
    for impl in reversed(impls):  # pluggy calls the last registered first
        if impl.plugin_name in skip:
            continue
        # pluggy's own call on a caller holding this one plugin: wrappers and argument subsets as usual
        # (pluggy >= 1.7 removes the others by identity, also one implementing the hook under a specname)
        only = pm.subset_hook_caller(
            name, remove_plugins=[i.plugin for i in impls if i.plugin is not impl.plugin]
        )
        try:
            only(**kwargs)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, naming the plugin
            failures.append(HookFailure(name, impl.plugin_name, exc))
    return failures
