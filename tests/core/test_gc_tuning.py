"""driver_gc: thresholds raised and start-up objects frozen inside, everything restored after."""

from __future__ import annotations

import gc
import weakref

from telescope.core.cluster.gc_tuning import DRIVER_THRESHOLDS, driver_gc


def test_thresholds_and_freeze_hold_inside_and_are_restored_after() -> None:
    before = gc.get_threshold()
    with driver_gc():
        assert gc.get_threshold() == DRIVER_THRESHOLDS
        assert gc.get_freeze_count() > 0  # what existed at start is out of the collector's sight
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected_automatically() -> None:
    """The collector stays on inside, at the given thresholds: a cycle made inside is freed by an
    automatic young collection once enough objects were allocated (no ``gc.collect`` here; with
    automatic collection off, or the thresholds ignored, the cycle would live on)."""

    class Node:
        other: Node

    collections: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(record)
    try:
        with driver_gc(thresholds=(100, 10, 10)):
            a, b = Node(), Node()
            a.other, b.other = b, a
            alive = weakref.ref(a)
            collections.clear()  # driver_gc's own collect at entry
            del a, b
            kept: list[list[int]] = [
                [] for _ in range(1_000)
            ]  # kept alive: each counts towards the young threshold
            survived = alive() is not None
            del kept
    finally:
        gc.callbacks.remove(record)
    assert 0 in collections, "no automatic young collection ran inside driver_gc"
    assert not survived
