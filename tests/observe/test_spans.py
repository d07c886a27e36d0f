"""Timeline events paired into per-step span durations (what TensorBoard and MLflow plot)."""

from __future__ import annotations

from telescope.core.observe import TimelineEvent
from telescope.core.observe.loggers.spans import SpanTimes


def _ev(phase: str, t: float, step: int, sample: int, **attrs: float) -> TimelineEvent:
    return TimelineEvent(
        type="generation", phase=phase, time=t, step=step, group_id=0, sample_id=sample, attrs=attrs
    )


def test_spans_pair_by_ids_and_count_for_their_start_step() -> None:
    spans = SpanTimes()
    spans.add(
        [_ev("start", 0.0, 1, 0), _ev("start", 1.0, 1, 1), _ev("end", 4.0, 2, 1), _ev("end", 2.0, 1, 0)]
    )
    spans.add([_ev("start", 5.0, 2, 0), _ev("instant", 5.5, 2, 0), _ev("end", 5.5, 2, 0)])
    [one] = spans.take(1)
    assert (one.step, one.count, one.total_s, one.max_s, one.mean_s) == (1, 2, 2.0 + 3.0, 3.0, 2.5)
    assert spans.take(1) == []  # taken once
    [two] = spans.take()
    assert (two.step, two.count, two.total_s) == (2, 1, 0.5)
    [total] = spans.totals()
    assert (total.label, total.count, total.total_s) == ("generation", 3, 5.5)


def test_open_starts_are_bounded_and_an_unmatched_end_is_skipped() -> None:
    spans = SpanTimes(max_open=2)
    spans.add([_ev("start", 0.0, 1, i) for i in range(3)])  # the first start is dropped
    spans.add([_ev("end", 1.0, 1, i) for i in range(3)] + [_ev("end", 9.0, 1, 7, duration_s=0.25)])
    assert spans.dropped == 1
    [stats] = spans.take()
    assert (stats.count, stats.total_s) == (3, 1.0 + 1.0 + 0.25)  # samples 1, 2 and the timed end
