"""The driver's garbage collector: fewer full collections while thousands of samples are in flight.

A driver keeps every in-flight sample's token lists, events and records alive at once; with
CPython's default thresholds (700, 10, 10) the collector re-walks that heap over and over. In
``bench/scale.py`` (64 simulated servers x 256 requests) collection was ~40% of the driver's
CPU per sample. ``driver_gc`` moves what exists at start-up (modules, tokenizer, config) out of
the collector's sight (``gc.freeze``) and raises the thresholds; cycles are still collected,
just in larger batches. Reference counting frees everything else at once, as before.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

DRIVER_THRESHOLDS = (200_000, 10, 10)
"""Allocations between young collections, and young (middle) collections per older one.

A young collection examines every object allocated since the last one that is still alive;
the longer the wait, the more of a sample's objects were already freed by reference counting.
``bench/scale.py``, 64 servers: collection cost 96 µs per sample at 32 requests per server and
162 at 256 with (10_000, 20, 20), 9 and 96 with these (a young collection every 200,000 objects
allocated holds at most a few tens of MB of cyclic garbage)."""


@contextlib.contextmanager
def driver_gc(thresholds: tuple[int, int, int] = DRIVER_THRESHOLDS) -> Iterator[None]:
    """Within the block: start-up objects frozen and ``thresholds`` in force; restored after."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
