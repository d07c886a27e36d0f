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
        self.traces: Any = None
        """An ``OtlpReceiver`` (vLLM tracing on): its per-request timings join the rollout records."""
        self._response_ids: dict[int, list[tuple[Any, list[str]]]] = defaultdict(list)

    def on_group(self, group: RolloutGroup, step: int) -> None:
        from telescope.core.observe.adapters import records_from_group

        if group.discard_reason == "off_policy":
            self.cancelled[step + 1] += int(group.info.get("cancelled_samples", 0))
        rows = records_from_group(group, step + 1)
        self.rows[step + 1].extend(rows)
        if self.traces is not None:
            ids = [list(getattr(s, "response_ids", []) or []) for s in group.samples]
            self._response_ids[step + 1].extend(zip(rows, ids, strict=True))

    def forget_unfinished_steps(self) -> None:
        """Drop what was collected for steps not logged yet (a restart from a checkpoint trains them again)."""
        self.rows.clear()
        self.cancelled.clear()
        self._response_ids.clear()
        self._last_step_end = time.time()

    def on_event(self, event: dict[str, Any]) -> None:
        fields = dict(event)
        kind, phase = fields.pop("type"), fields.pop("phase", "instant")
        known = {k: fields.pop(k) for k in _EVENT_FIELDS if k in fields}
        self.hub.event(kind, phase, **known, attrs=fields)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        from telescope.core.observe import perf_metrics, rollout_metrics

        rows = self.rows.pop(step, [])
        self._add_trace_timings(self._response_ids.pop(step, []))
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

    def _add_trace_timings(self, pairs: list[tuple[Any, list[str]]]) -> None:
        """vLLM's per-request timings as ``vllm_<name>`` in each record's ``timings``.

        Looked up without waiting: by the end of the step the spans of its rollouts have long
        been exported (every 200 ms); a missing span leaves the record without them. The
        timings of a multi-turn rollout add up over its turns (``vllm_ttft`` is the first turn's).
        """
        for row, ids in pairs:
            merged: dict[str, float] = {}
            for turn, response_id in enumerate(ids):
                for name, value in self.traces.timings(response_id, wait_s=0.0).items():
                    if name == "max_tokens" or (name == "ttft" and turn > 0):
                        continue
                    merged[f"vllm_{name}"] = merged.get(f"vllm_{name}", 0.0) + value
            row.timings.update(merged)

    def on_info(self, info: dict[str, Any]) -> None:
        """Run-level facts (``run.json`` ``info``)."""
        self.hub.log_info(info)

    def on_eval(self, step: int, results: list[Any]) -> None:
        """Eval results (``EvalResult`` objects) of one eval round at ``step``."""
        for result in results:
            self.hub.log_eval(step, result.name, result.metrics, result.rows)

    def logger_ids(self) -> dict[str, Any]:
        """Each logger's run ids, stored in checkpoints so a resume continues the same runs."""
        return dict(self.hub.run_ids())

    def warn(self, message: str) -> None:
        self.hub.warn(message)
