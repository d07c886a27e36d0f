"""A third-party plugin file, as a user writes one: it records every run hook call in ``seen``.

``test_e2e_ray.py`` loads it like ``telescope train -p run_watcher.py`` would and compares what
it saw with what the built-in ``local`` logger wrote into the run directory.
"""

from __future__ import annotations

from typing import Any

from telescope.core import hookimpl

seen: dict[str, Any] = {
    "start": [],
    "groups": [],
    "events": [],
    "steps": [],
    "rollouts": {},
    "evals": [],
    "info": {},
    "system": [],
    "end": [],
}


@hookimpl
def telescope_run_start(config: Any, run_dir: str) -> None:
    seen["start"].append(run_dir)


@hookimpl
def telescope_run_info(info: dict[str, Any]) -> None:
    seen["info"].update(info)


@hookimpl
def telescope_group_end(group: Any, step: int) -> None:
    seen["groups"].append((step, group.group_id, len(group.samples), group.discard_reason))


@hookimpl
def telescope_events(events: list[Any]) -> None:
    seen["events"].extend(event.to_dict() for event in events)


@hookimpl
def telescope_step_end(step: int, metrics: dict[str, float], rollouts: list[Any]) -> None:
    seen["steps"].append({"step": step, "metrics": dict(metrics)})
    seen["rollouts"][step] = [(r.group_id, r.sample_id) for r in rollouts]


@hookimpl
def telescope_eval_end(step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
    seen["evals"].append({"step": step, "name": name, "metrics": dict(metrics), "samples": len(rows)})


@hookimpl
def telescope_system_sample(sample: dict[str, Any]) -> None:  # from the samplers' threads
    seen["system"].append((sample["time"], sample["node"], sample["source"], sorted(sample["metrics"])))


@hookimpl
def telescope_run_end(status: str) -> None:
    seen["end"].append(status)
