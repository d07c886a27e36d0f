"""The run's timeline events on their way to the hooks: queued, then handed over once per loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from telescope.core.errors import stage_error
from telescope.core.observe.rundir.records import TimelineEvent

if TYPE_CHECKING:
    import pluggy

__all__ = ["EventQueue"]


class EventQueue:
    """Events not yet handed to ``telescope_events`` (at most until the next loop turn)."""

    def __init__(
        self, hook: pluggy.HookRelay, step: Callable[[], int], fail: Callable[[BaseException], None]
    ) -> None:
        """``step``: the step being filled (an event's default); ``fail``: ends the run (a plugin raised)."""
        self.hook = hook
        self.step = step
        self.fail = fail
        self._events: list[TimelineEvent] = []

    def event(self, kind: str, phase: str, **fields: Any) -> None:
        """A timeline event from loose fields (``TimelineEvent.of``); its step defaults to the one being filled."""
        fields.setdefault("step", self.step())
        self.emit(TimelineEvent.of(kind, phase, **fields))

    def emit(self, event: TimelineEvent) -> None:
        """Queue ``event`` for the hooks: the events of one loop turn reach ``telescope_events`` together."""
        if not self._events:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop running (before or after the run): hand it over now
                self._events.append(event)
                self.flush()
                return
        self._events.append(event)

    def flush(self) -> None:
        """Hand the queued events to ``telescope_events`` (a plugin raising ends the run, naming the hook)."""
        if not self._events:
            return
        events, self._events = self._events, []
        try:
            self.hook.telescope_events(events=events)
        except Exception as exc:  # noqa: BLE001 - a plugin's error ends the run (hookspecs.py), named as
            # such: raised inside a sample's request it would be counted as a failed rollout instead
            self.fail(stage_error("the telescope_events hook", exc, events[-1].step))
