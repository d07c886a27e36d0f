"""driver_gc: thresholds raised and start-up objects frozen inside, everything restored after."""

from __future__ import annotations

import gc

from telescope.core.cluster.gc_tuning import DRIVER_THRESHOLDS, driver_gc


def test_thresholds_and_freeze_hold_inside_and_are_restored_after() -> None:
    before = gc.get_threshold()
    with driver_gc():
        assert gc.get_threshold() == DRIVER_THRESHOLDS
        assert gc.get_freeze_count() > 0  # what existed at start is out of the collector's sight
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected() -> None:
    import weakref

    class Node:
        pass

    with driver_gc(thresholds=(100, 10, 10)):
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        alive = weakref.ref(a)
        del a, b
        for _ in range(5_000):  # allocations enough for young collections to run
            [object() for _ in range(10)]
        gc.collect(1)
        assert alive() is None
