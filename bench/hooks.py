"""What the run hooks cost per sample: the plugin manager's dispatch next to a direct call.

Run: ``.venv/bin/python bench/hooks.py [--samples N] [--group-size G] [--repeats R]``.

A run reports each sample's four timeline events (its generation and reward spans) through
``telescope_events``, which the driver calls once per turn of its event loop with the events of
that turn, and each group through one ``telescope_group_end`` (``hookspecs.py``). This replays
those calls, with prebuilt events and groups (``--events-per-call`` events per call; 1 is what
one call per event cost), three ways:

- ``direct``: the hub's method called directly (what the old private observer did; no
  dispatch at all for groups, which it handled itself);
- ``hooks``: through ``pm.hook`` with core's built-in plugins and the run's hub registered,
  as in a run;
- ``hooks + plugin``: the same with a third-party plugin recording every call.

The hub holds a no-op logger in the first three rows, so the figures are dispatch only; the
last row is the hub with the real ``local`` logger writing a run directory, for scale (the
work the hooks deliver to). Figures are µs per sample (min and median of R repeats); compare
them only on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from telescope.core.observe import Logger, LoggerHub, TimelineEvent
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.plugins import get_plugin_manager
from telescope.core.rollouts.groups import RolloutGroup, RolloutSample
from telescope.core.testing import RunRecorder, make_config


def workload(samples: int, group_size: int) -> tuple[list[TimelineEvent], list[RolloutGroup]]:
    """The events and groups a run reports for ``samples`` samples."""
    events, groups = [], []
    for index in range(samples):
        gid, sid = divmod(index, group_size)
        where = {"step": 1, "group_id": gid, "sample_id": sid, "server": 0, "lane": sid}
        events += [
            TimelineEvent.of("generation", "start", **where),
            TimelineEvent.of("generation", "end", **where),
            TimelineEvent.of("reward", "start", step=1, group_id=gid, sample_id=sid),
            TimelineEvent.of("reward", "end", step=1, group_id=gid, sample_id=sid),
        ]
    for gid in range(samples // group_size):
        sample = RolloutSample([1, 2, 3], [4, 5], [-0.5, -0.5], None, "stop", 1.0, 1.0)
        groups.append(RolloutGroup(gid, "toy", gid, [sample] * group_size, 0))
    return events, groups


def timed(fn: Callable[[], None], repeats: int) -> tuple[float, float]:
    """(min, median) seconds of ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def hub_plugin_manager(hub: LoggerHub, *extra: object) -> Any:
    """A plugin manager as in a run: core's built-ins (no entry points), the hub, ``extra``."""
    pset = get_plugin_manager(load_entrypoints=False)
    pset.pm.register(hub, name="core.logger_hub")
    for plugin in extra:
        pset.pm.register(plugin)
    return pset.pm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--events-per-call", type=int, default=32, help="events per telescope_events call")
    args = parser.parse_args()
    events, groups = workload(args.samples, args.group_size)
    per = max(1, args.events_per_call)
    batches = [events[i : i + per] for i in range(0, len(events), per)]

    def direct(hub: LoggerHub) -> Callable[[], None]:
        def run() -> None:
            for batch in batches:
                hub.telescope_events(batch)

        return run

    def through(pm: Any) -> Callable[[], None]:
        hook = pm.hook

        def run() -> None:
            for batch in batches:
                hook.telescope_events(events=batch)
            for group in groups:
                hook.telescope_group_end(group=group, step=1)

        return run

    rows = [
        ("direct (hub method, no-op logger)", direct(LoggerHub([Logger()]))),
        ("hooks (built-ins + hub, no-op logger)", through(hub_plugin_manager(LoggerHub([Logger()])))),
        (
            "hooks + plugin (+ a recording plugin)",
            through(hub_plugin_manager(LoggerHub([Logger()]), RunRecorder())),
        ),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        local = LoggerHub([LocalLogger()])
        local.start(make_config(), tmp, system_metrics=False, ticker=False)
        rows.append(("hooks (hub with the local logger)", through(hub_plugin_manager(local))))
        print(
            f"{args.samples} samples, groups of {args.group_size}: 4 events per sample ({per} per call), "
            "1 group_end per group"
        )
        print(f"{'path':<40} {'µs/sample min':>14} {'median':>8}")
        figures = {}
        for name, fn in rows:
            best, median = timed(fn, args.repeats)
            figures[name] = best
            print(f"{name:<40} {best / args.samples * 1e6:>14.2f} {median / args.samples * 1e6:>8.2f}")
        local.finish()
    names = list(figures)
    overhead = (figures[names[1]] - figures[names[0]]) / args.samples * 1e6
    print(
        f"dispatch overhead of the hooks: {overhead:.2f} µs per sample "
        f"({figures[names[1]] / figures[names[3]]:.0%} of the hooked path with the local logger)"
    )


if __name__ == "__main__":
    main()
