"""The health sentinel: named findings about a training run, decided from its own metrics.

A reader of the run's event channel (``telescope_step_end``, ``telescope_group_end``), like the
loggers: each step's metrics and rollouts become signals (``signals.py``), each finding is one
documented rule over the run's recent history (``rules.py``, robust statistics in ``stats.py``),
and a finding is acted on through the run's own controls only (``sentinel.py``: warn, stop, or
rollback to a checkpoint). The rules are documented in ``docs/health.md``.
"""

from __future__ import annotations

__all__ = ["ACTIONS", "FINDINGS", "HEALTH_PLUGIN"]

#: Every finding the sentinel can raise, in the order the docs describe them.
FINDINGS = (
    "entropy_collapse",
    "kl_spike",
    "grad_norm_spike",
    "length_blowup",
    "length_collapse",
    "reward_saturated",
    "degenerate_outputs",
    "nonfinite",
)

#: What a finding can do (``health_<finding>_action``): ``off`` turns the rule off.
ACTIONS = ("off", "warn", "stop", "rollback")

#: The plugin name of a run's sentinel while the run is on.
HEALTH_PLUGIN = "core.health"
