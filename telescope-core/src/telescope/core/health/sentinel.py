"""``HealthSentinel``: the run's health rules on its event channel, and their actions.

The driver registers one sentinel as the plugin ``core.health`` for the whole run (restarts and
rollbacks included). It reads ``telescope_step_end`` and ``telescope_group_end`` like a logger;
what a raised finding does is its ``health_<finding>_action``:

- ``warn``: a console line (``telescope_warning``), a ``run`` instant on the timeline
  (``name`` ``health/<finding>``), ``info.health`` in run.json, and ``health/<finding>`` = 1 in
  the step's metrics while it lasts;
- ``stop``: the same, then after the step's hooks a checkpoint of the step and the run ends
  with the finding's line (``HealthStop``; the step hook is ``runtime.health_actions``);
- ``rollback``: the same, then the run restarts from the newest checkpoint older than the
  finding's window with its learning rate times ``health_rollback_lr_factor``
  (``HealthRollback``, carried out by the driver: ``runtime.supervision.rollback``); at most
  ``health_max_rollbacks`` times, then ``stop``.

``reward_saturated`` is decided on groups, so it also fires while no step completes (every
group discarded): its ``stop``/``rollback`` end the run session at once, through ``fail``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from telescope.core import hookimpl
from telescope.core.health import FINDINGS
from telescope.core.health.findings import Finding, HealthRollback, HealthStop
from telescope.core.health.rules import RewardSaturation, step_rules
from telescope.core.health.signals import MODEL_OUTCOMES, step_signals
from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent

if TYPE_CHECKING:
    import pluggy

    from telescope.core.config import TelescopeConfig
    from telescope.core.rollouts.groups import RolloutGroup

__all__ = ["HealthSentinel"]

log = logging.getLogger("telescope.health")

RECORDED_FINDINGS = 100
"""run.json keeps the latest this many findings (``count`` has them all)."""


class HealthSentinel:
    """Decides findings from the run's step metrics and groups (a plugin on the run hooks)."""

    def __init__(
        self, cfg: TelescopeConfig, hook: pluggy.HookRelay, fail: Callable[[BaseException], None]
    ) -> None:
        """``hook``: the run hooks it reports through; ``fail``: ends the current run session."""
        self.cfg, self.hook, self.fail = cfg, hook, fail
        self.actions = {name: str(getattr(cfg, f"health_{name}_action")) for name in FINDINGS}
        self.rules = step_rules(cfg)
        self.saturation = (
            RewardSaturation(cfg.health_reward_saturated_groups, cfg.health_reward_saturated_share)
            if self.actions["reward_saturated"] != "off"
            else None
        )
        self.findings: list[Finding] = []
        self.active: set[str] = set()
        """Findings raised whose condition still holds."""
        self.pending: Finding | None = None
        """A raised ``stop``/``rollback`` the step hook carries out after this step."""
        self.rollbacks = 0
        self.learning_rate = cfg.learning_rate
        self.ended = ""
        """How the sentinel ended the run: ``stopped``, ``rolled_back`` (then the run goes on), or ''."""

    # --- reading -----------------------------------------------------------------------
    @hookimpl
    def telescope_run_start(self, config: TelescopeConfig, run_dir: str) -> None:
        """``info.health`` from the start: a run with no finding says ``ok``."""
        self.report()

    @hookimpl(tryfirst=True)
    def telescope_step_end(self, step: int, metrics: dict[str, float], rollouts: list[RolloutRecord]) -> None:
        """Judge the step; its ``health/*`` metrics join ``metrics`` before the loggers record them."""
        signals = step_signals(step, metrics, rollouts)
        for rule in self.rules:
            seen = rule.observe(signals)
            if seen.raised:
                self._raise(Finding(rule.name, step, seen.onset, seen.evidence, self.actions[rule.name]))
            if not seen.anomalous:
                self.active.discard(rule.name)
        for name in FINDINGS:
            if self.actions[name] != "off":
                metrics[f"health/{name}"] = float(name in self.active)
        metrics["health/findings"] = float(len(self.findings))

    @hookimpl
    def telescope_group_end(self, group: RolloutGroup, step: int) -> None:
        """``reward_saturated`` over the finished groups (kept or discarded alike)."""
        if self.saturation is None or group.discard_reason not in MODEL_OUTCOMES:
            return
        seen = self.saturation.observe(group.rewards, step)
        if not seen.anomalous:
            self.active.discard(self.saturation.name)
        if not seen.raised:
            return
        finding = Finding(
            self.saturation.name, step, seen.onset, seen.evidence, self.actions[self.saturation.name]
        )
        self._raise(finding)
        if self.pending is finding:  # no step may complete any more: act now, between steps
            self.pending = None
            self._end_now(finding)

    # --- reporting ---------------------------------------------------------------------
    def _raise(self, finding: Finding) -> None:
        self.findings.append(finding)
        self.active.add(finding.name)
        if finding.action in ("stop", "rollback") and self.pending is None:
            self.pending = finding
        what = {"warn": "", "stop": "; stopping the run", "rollback": self._rollback_plan(finding)}[
            finding.action
        ]
        self.hook.telescope_warning(
            message=f"{finding.line()} (health_{finding.name}_action: {finding.action}{what})"
        )
        attrs = {
            "finding": finding.name,
            "evidence": finding.evidence,
            "action": finding.action,
            "onset": finding.onset,
        }
        event = TimelineEvent("run", name=f"health/{finding.name}", step=finding.step, attrs=attrs)
        self.hook.telescope_events(events=[event])
        self.report()

    def _rollback_plan(self, finding: Finding) -> str:
        """What a ``rollback`` finding's warning line says will happen."""
        target, why_not = self.rollback_target(finding)
        return (
            f"; rolling back to step {target}"
            if target is not None
            else f"; stopping the run, not rolled back: {why_not}"
        )

    def report(self) -> None:
        """``info.health`` in run.json: the state, the findings, the rollbacks and the learning rate."""
        self.hook.telescope_run_info(info={"health": self.summary()})

    def summary(self) -> dict[str, Any]:
        """What run.json's ``info.health`` holds (``telescope runs show``, the dashboard's Overview)."""
        state = self.ended or ("warning" if self.findings else "ok")
        return {
            "state": state,
            "count": len(self.findings),
            "findings": [f.record() for f in self.findings[-RECORDED_FINDINGS:]],
            "rollbacks": self.rollbacks,
            "learning_rate": self.learning_rate,
            "actions": {name: action for name, action in self.actions.items()},
        }

    # --- acting --------------------------------------------------------------------------
    def take_pending(self) -> Finding | None:
        finding, self.pending = self.pending, None
        return finding

    def rollback_target(self, finding: Finding) -> tuple[int | None, str]:
        """For a ``rollback`` finding, the newest checkpoint from before its window (``window_start``);
        else None and why there is none ('' for other actions)."""
        from telescope.core.checkpoint.run_checkpoints import checkpoint_steps

        if finding.action != "rollback":
            return None, ""
        if self.rollbacks >= self.cfg.health_max_rollbacks:
            return None, f"health_max_rollbacks ({self.cfg.health_max_rollbacks}) used up"
        last = self.window_start(finding) - 2 - self.cfg.max_async_rollout
        older = [s for s in checkpoint_steps(self.cfg) if s <= last]
        if not older:
            every = self.cfg.checkpoint_every
            return None, f"no checkpoint at step {last} or before (checkpoint_every: {every})"
        return max(older), ""

    def window_start(self, finding: Finding) -> int:
        """The first step of the trouble ``finding`` is part of: the earliest onset of the findings
        raised over the last ``health_window_steps`` steps up to it (a warn finding too: the outputs
        degenerate a step before the KL to the sampler crosses its line)."""
        recent = [
            f.onset
            for f in self.findings
            if finding.step - self.cfg.health_window_steps < f.step <= finding.step
        ]
        return min([finding.onset, *recent])

    def stop(self, finding: Finding, checkpoint: str, why_not: str = "") -> HealthStop:
        """The error a stop ends the run with; ``checkpoint`` says what it saved."""
        self.ended = "stopped"
        self.report()
        instead = f"; not rolled back: {why_not}" if why_not else ""
        action = f"health_{finding.name}_action: {finding.action}{instead}"
        return HealthStop(f"{finding.line()}; the run stopped ({action}); {checkpoint}")

    def rollback(self, finding: Finding, step: int) -> HealthRollback:
        """The error the driver restarts the run on, from ``step``'s checkpoint at a lower learning rate."""
        self.rollbacks += 1
        before, self.learning_rate = (
            self.learning_rate,
            self.learning_rate * self.cfg.health_rollback_lr_factor,
        )
        for rule in self.rules:
            rule.rewind(step)
        if self.saturation is not None:
            self.saturation.rewind(step)
        self.active.clear()
        self.ended = "rolled_back"
        self.report()
        return HealthRollback(
            f"{finding.line()}; rolling back to the checkpoint of step {step} with learning_rate "
            f"{before:.3g} -> {self.learning_rate:.3g} (rollback {self.rollbacks} of health_max_rollbacks "
            f"{self.cfg.health_max_rollbacks})",
            step,
            self.learning_rate,
        )

    def _end_now(self, finding: Finding) -> None:
        """Carry out a stop or rollback between steps (``reward_saturated`` while no step completes)."""
        target, why_not = self.rollback_target(finding)
        if target is not None:
            self.fail(self.rollback(finding, target))
        else:
            self.fail(self.stop(finding, "no checkpoint of this step: it has not completed", why_not))
