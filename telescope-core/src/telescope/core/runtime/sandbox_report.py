"""A step's sandbox spans (``sandbox/telemetry.py``): on the timeline, and as ``sandbox/*`` metrics.

Once per step the run drains what every sandbox did since the last step: each call becomes a
``sandbox`` span on the timeline (name: ``create``, ``upload``, ``execute``, ``destroy``; the
sandbox, provider, image, resources, command, exit code, duration, timed out, OOM in its attrs),
and the step's metrics get the create-to-ready and command-time p50/p95, the live sandboxes, the
timeouts, OOM kills, non-zero exits and infrastructure errors, and the CPU seconds per sample.
A figure nothing measured in a step is left out, never written as 0: the percentiles of a step
without a create (or a finished command), the CPU seconds unless the provider measured every
command's (bubblewrap without a cgroup measures none).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from telescope.core.observe.rundir.records import TimelineEvent
from telescope.core.sandbox.telemetry import SPANS, SandboxSpan
from telescope.core.sandbox.tracking import live_sandboxes

__all__ = ["METRICS", "drain", "percentile", "sandbox_metrics", "span_events"]

METRICS: tuple[str, ...] = (
    "sandbox/creates",
    "sandbox/create_to_ready_p50_s",
    "sandbox/create_to_ready_p95_s",
    "sandbox/execs",
    "sandbox/exec_p50_s",
    "sandbox/exec_p95_s",
    "sandbox/live",
    "sandbox/timeouts",
    "sandbox/oom_kills",
    "sandbox/nonzero_exits",
    "sandbox/infra_errors",
    "sandbox/cpu_s_per_sample",
)
"""Every ``sandbox/*`` metric a step can have (the dashboard says which a run never measured)."""


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values`` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def span_events(spans: list[SandboxSpan], step: int) -> list[TimelineEvent]:
    """A ``sandbox`` start and end event per span, at the times the call started and ended."""
    events = []
    for span in spans:
        attrs = {"sandbox_id": span.sandbox_id, "provider": span.provider, "env": span.env, **span.attrs}
        if span.failed:
            attrs["failed"] = span.failed
        for phase, at in (("start", span.start), ("end", span.end)):
            events.append(TimelineEvent("sandbox", phase, name=span.action, step=step, time=at, attrs=attrs))
    return events


def sandbox_metrics(spans: list[SandboxSpan], samples: int) -> dict[str, float]:
    """The step's ``sandbox/*`` metrics (none while the run uses no sandbox)."""
    live = len(live_sandboxes())
    if not spans and not live:
        return {}
    creates = [s.end - s.start for s in spans if s.action == "create" and not s.failed]
    execs = [s for s in spans if s.action == "execute"]
    finished = [s for s in execs if not s.failed]
    times = [float(s.attrs.get("duration_s") or s.end - s.start) for s in finished]
    cpu = [float(c) for s in finished if (c := s.attrs.get("cpu_s")) is not None]
    measured: dict[str, float] = {}
    if finished and samples and len(cpu) == len(finished):  # a partial sum is no sample's CPU
        measured["sandbox/cpu_s_per_sample"] = sum(cpu) / samples
    for name, values in (("create_to_ready", creates), ("exec", times)):
        if values:
            measured[f"sandbox/{name}_p50_s"] = percentile(values, 0.5)
            measured[f"sandbox/{name}_p95_s"] = percentile(values, 0.95)
    return measured | {
        "sandbox/creates": float(len(creates)),
        "sandbox/execs": float(len(execs)),
        "sandbox/live": float(live),
        "sandbox/timeouts": float(sum(bool(s.attrs.get("timed_out")) for s in finished)),
        "sandbox/oom_kills": float(
            sum(bool(s.attrs.get("oom")) or s.attrs.get("infra_cause") == "sandbox_oom" for s in spans)
        ),
        "sandbox/nonzero_exits": float(sum(s.attrs.get("exit_code") not in (0, None) for s in finished)),
        "sandbox/infra_errors": float(sum(bool(s.attrs.get("infra_cause")) for s in spans)),
    }


def drain(emit: Callable[[TimelineEvent], None], step: int, samples: int) -> dict[str, float]:
    """Hand the spans since the last step to ``emit`` (the timeline); returns the step's metrics."""
    spans = SPANS.drain()
    for event in span_events(spans, step):
        emit(event)
    return sandbox_metrics(spans, samples)
