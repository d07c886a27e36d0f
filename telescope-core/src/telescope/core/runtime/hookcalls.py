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

from telescope.core.runtime.errors import describe_failure

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
    caller: pluggy.HookCaller, kwargs: Mapping[str, Any], skip: Container[str] = ()
) -> list[HookFailure]:
    """Call every implementation of ``caller`` (in pluggy's order) but those of the plugins in ``skip``,
    each on its own; returns the failures instead of raising the first (``Exception`` only: Ctrl-C
    still stops the run's end)."""
    failures: list[HookFailure] = []
    for impl in reversed(caller.get_hookimpls()):  # pluggy calls the last registered first
        if impl.plugin_name in skip:
            continue
        try:
            # pluggy's own executor, on this one implementation: wrappers and argument subsets as usual
            caller._hookexec(caller.name, [impl], dict(kwargs), False)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, naming the plugin
            failures.append(HookFailure(caller.name, impl.plugin_name, exc))
    return failures
