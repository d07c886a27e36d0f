"""The logger interface plugins implement, and the hub that fans every call out to them.

A logger overrides only what it records; the base methods accept and ignore the call (an
observer that does not care about, say, system samples needs no code for them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Logger"]


class Logger:
    """Base class of logger plugins (``telescope_register_loggers``).

    Call order: ``start`` once, then any number of ``log_*``/``warn``/``tick`` calls (possibly
    from a background thread for ``log_system`` and ``tick``), then ``finish`` once, which
    must hand over anything still buffered. ``required = True`` makes a
    failure in ``start`` stop the run (the local run directory); other loggers are dropped.
    """

    name: str = "logger"
    required: bool = False

    def start(self, cfg: TelescopeConfig, run_dir: Path, resume_ids: dict[str, Any] | None = None) -> None:
        """Open outputs for the run configured by ``cfg``. ``resume_ids`` is what ``run_ids()`` returned in
        the run being resumed."""

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """Record the step metrics (trainer metrics, rollout metrics, timings) of ``step``."""

    def log_rollouts(self, step: int, rows: list[RolloutRecord]) -> None:
        """Record rollouts (kept, discarded and cancelled) collected for ``step``."""

    def log_events(self, events: list[TimelineEvent]) -> None:
        """Record timeline events."""

    def log_system(self, sample: dict[str, Any]) -> None:
        """Record one system-metrics sample: ``{"time", "node", "source", "metrics": {name: value}}``."""

    def log_eval(self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """Record one eval's results at ``step``: its scores and its per-sample ``rows``."""

    def log_info(self, info: dict[str, Any]) -> None:
        """Record run-level facts (environment details, reward/metric ranges, setup)."""

    def warn(self, message: str) -> None:
        """Show a warning to the user."""

    def tick(self) -> None:
        """Called every ``LoggerHub.tick_s`` seconds from the hub's thread: hand over what is due."""

    def finish(self, status: str) -> None:
        """Close outputs. ``status``: ``finished``, ``failed`` or ``interrupted``."""

    def run_ids(self) -> dict[str, Any]:
        """Identifiers needed to continue the same run on resume (e.g. the W&B run id)."""
        return {}
