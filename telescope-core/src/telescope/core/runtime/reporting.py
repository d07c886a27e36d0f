"""What the run reports through the run hooks (``hookspecs.py``) that needs bookkeeping first.

``StepRollouts`` turns the groups reported for a step into that step's rollout records and
rollout/throughput metrics (``telescope_step_end`` gets both), and, with vLLM tracing, each of their
requests' vLLM span into its timings and a ``vllm_request`` timeline span; ``report_evals`` turns an
eval round into ``telescope_eval_end`` calls and ``eval`` timeline events.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent, eval_event

if TYPE_CHECKING:
    import pluggy

    from telescope.core.observe.samplers.otlp import OtlpReceiver
    from telescope.core.rollouts.groups import RolloutGroup

__all__ = ["SPAN_GRACE_S", "StepRollouts", "report_evals"]

#: How long a step's close waits, in all, for vLLM spans not exported yet (its exporter sends every 200 ms).
SPAN_GRACE_S = 1.0


class StepRollouts:
    """The rollout records of the steps not reported yet, and the time the last step ended."""

    def __init__(self) -> None:
        self._rows: dict[int, list[RolloutRecord]] = defaultdict(list)
        self._cancelled: dict[int, int] = defaultdict(int)
        self._response_ids: dict[int, list[tuple[RolloutRecord, list[str]]]] = defaultdict(list)
        self._last_step_end = time.time()
        self.traces: OtlpReceiver | None = None
        """The OTLP receiver (vLLM tracing on): its per-request timings join the records."""
        self.emit: Callable[[TimelineEvent], None] | None = None
        """Where each request's span goes as a timeline span (the orchestrator's event queue)."""

    def trace(self, receiver: OtlpReceiver | None, emit: Callable[[TimelineEvent], None]) -> None:
        """Join vLLM's request spans from ``receiver`` (None: tracing off) to the records, and hand
        each to ``emit`` as a ``vllm_request`` timeline span."""
        self.traces, self.emit = receiver, emit

    def add(self, group: RolloutGroup, step: int) -> None:
        """Records of ``group``, reported for the 1-based ``step``."""
        from telescope.core.observe.adapters import records_from_group

        self._cancelled[step] += int(group.info.get("cancelled_samples", 0))
        rows = records_from_group(group, step)
        self._rows[step].extend(rows)
        if self.traces is not None:
            ids = [list(s.response_ids) for s in group.samples]
            self._response_ids[step].extend(zip(rows, ids, strict=True))

    def close(self, step: int, metrics: dict[str, float]) -> list[RolloutRecord]:
        """``step``'s records; its rollout and throughput metrics are added to ``metrics``."""
        from telescope.core.observe import perf_metrics, rollout_metrics

        rows = self._rows.pop(step, [])
        self._add_trace_timings(self._response_ids.pop(step, []))
        now = time.time()
        metrics.update(rollout_metrics(rows, extra_cancelled=self._cancelled.pop(step, 0)))
        tokens = int(metrics.get("batch/num_tokens", 0))
        metrics.update(perf_metrics(now - self._last_step_end, tokens, int(metrics.get("async_level", 0))))
        self._last_step_end = now
        return rows

    def _add_trace_timings(self, pairs: list[tuple[RolloutRecord, list[str]]]) -> None:
        """vLLM's per-request timings as ``vllm_<name>`` in each record's ``timings``, and each
        request's span on the timeline (``emit``).

        Most spans are here by the end of the step (vLLM exports every 200 ms), but a request that
        finished just before a fast step closed may not be yet: missing ones are waited for, all of
        a step's together, up to ``SPAN_GRACE_S`` (a span still missing then leaves its record
        without them). The timings of a multi-turn rollout add up over its turns (``vllm_ttft`` is
        the first turn's).
        """
        from telescope.core.observe.samplers.otlp import request_span_events, span_timings

        if self.traces is None:
            return
        deadline = time.monotonic() + SPAN_GRACE_S
        for row, ids in pairs:
            merged: dict[str, float] = {}
            for turn, response_id in enumerate(ids):
                span = self.traces.lookup(response_id, wait_s=max(0.0, deadline - time.monotonic()))
                if span is None:
                    continue
                for name, value in span_timings(span).items():
                    if name == "max_tokens" or (name == "ttft" and turn > 0):
                        continue
                    merged[f"vllm_{name}"] = merged.get(f"vllm_{name}", 0.0) + value
                if self.emit is not None:
                    for event in request_span_events(span, turn, **_timeline_ids(row)):
                        self.emit(event)
            row.timings.update(merged)


def _timeline_ids(row: RolloutRecord) -> dict[str, int | None]:
    """A record's ids as its timeline events carry them (an unknown server or lane: None)."""
    return {
        "step": row.step,
        "group_id": row.group_id,
        "sample_id": row.sample_id,
        "server": row.server if row.server >= 0 else None,
        "lane": row.lane if row.lane >= 0 else None,
    }


def report_evals(hook: pluggy.HookRelay, step: int, results: Sequence[Any]) -> None:
    """One eval round at ``step``: ``telescope_eval_end`` and an ``eval`` instant event per result.

    Args:
        results: ``EvalResult`` objects (``name``, ``metrics``, ``rows``).
    """
    for result in results:
        rows = [dict(r) for r in result.rows]
        hook.telescope_eval_end(
            step=int(step), name=str(result.name), metrics=dict(result.metrics), rows=rows
        )
        hook.telescope_events(events=[eval_event(step, result.name, result.metrics, len(rows))])
