"""The default run observer: rollouts, events and step metrics go to the logger hub."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from telescope.core.runtime.groups import RolloutGroup

__all__ = ["HubObserver"]


_EVENT_FIELDS = ("name", "step", "group_id", "sample_id", "server", "lane", "rank", "time")


class HubObserver:
    """Collects each step's rollout records, adds rollout and perf metrics, forwards to the hub.

    A group reported while batch ``b`` (0-based) is being filled belongs to training step
    ``b + 1``: kept groups are trained there, discarded ones are accounted there.
    """

    def __init__(self, cfg: Any, hub: Any, pset: Any = None) -> None:
        self.cfg = cfg
        self.hub = hub
        self.pset = pset
        self.rows: dict[int, list[Any]] = defaultdict(list)
        self.cancelled: dict[int, int] = defaultdict(int)
        self.steps: list[dict[str, float]] = []
        self._last_step_end = time.time()

    def on_group(self, group: RolloutGroup, step: int) -> None:
        from telescope.core.observe.adapters import records_from_group

        if group.discard_reason == "off_policy":
            self.cancelled[step + 1] += int(group.info.get("cancelled_samples", 0))
        self.rows[step + 1].extend(records_from_group(group, step + 1))

    def on_event(self, event: dict[str, Any]) -> None:
        fields = dict(event)
        kind, phase = fields.pop("type"), fields.pop("phase", "instant")
        known = {k: fields.pop(k) for k in _EVENT_FIELDS if k in fields}
        self.hub.event(kind, phase, **known, attrs=fields)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        from telescope.core.observe import perf_metrics, rollout_metrics

        rows = self.rows.pop(step, [])
        now = time.time()
        metrics.update(rollout_metrics(rows, extra_cancelled=self.cancelled.pop(step, 0)))
        tokens = int(metrics.get("batch/num_tokens", 0))
        metrics.update(perf_metrics(now - self._last_step_end, tokens, int(metrics.get("async_level", 0))))
        self._last_step_end = now
        self.hub.log_rollouts(step, rows)
        self.hub.log_step(step, metrics)
        self.steps.append(metrics)
        if self.pset is not None:
            self.pset.pm.hook.telescope_step_end(step=step, metrics=metrics)

    def on_eval(self, step: int, results: list[Any]) -> None:
        """Eval results (``EvalResult`` objects) of one eval round at ``step``."""
        for result in results:
            self.hub.log_eval(step, result.name, result.metrics, result.rows)

    def logger_ids(self) -> dict[str, Any]:
        """Each logger's run ids, stored in checkpoints so a resume continues the same runs."""
        return dict(self.hub.run_ids())

    def warn(self, message: str) -> None:
        self.hub.warn(message)
