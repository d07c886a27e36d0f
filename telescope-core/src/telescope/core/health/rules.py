"""One rule per finding, each over the run's own recent history (``docs/health.md`` states them).

A step rule reads some ``StepSignals`` fields. While it has fewer than ``min_history`` healthy
values of them it only collects; after that each step is compared with the median and spread of
the last ``window`` healthy values (``stats.Baseline``). An anomalous step is kept out of the
history, so a collapse that lasts is measured against the steps before it, not against itself;
``patience`` anomalous steps in a row raise the finding, once, until a healthy step re-arms it. The
finding's window (``onset``) starts at the first anomalous step of its episode, not of its last
streak: an episode ends only after ``patience`` healthy steps in a row (as many as open one), so a KL
that crosses the line, dips back for one step and crosses again went wrong at the first crossing (a
rollback restores a checkpoint from before it).
``reward_saturated`` reads finished rollout groups instead (it also fires while no step completes).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from telescope.core.health.stats import Baseline, History

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.health.signals import StepSignals

__all__ = ["Observation", "RewardSaturation", "StepRule", "spike_limit", "step_rules"]

SPREAD_FLOOR = 0.1
"""A spike's spread is at least this share of the median: a flat history (MAD ~0) does not make
every small wobble a spike."""


@dataclass(frozen=True)
class Observation:
    """A rule's verdict on one step (or one group)."""

    anomalous: bool
    evidence: str = ""
    onset: int = 0
    """The first anomalous step of the episode (anomalies less than ``patience`` healthy steps apart)."""
    raised: bool = False
    """The streak reached the rule's patience now: the finding is raised at this step."""


HEALTHY = Observation(False)


def spike_limit(base: Baseline, mads: float) -> float:
    """The value above which a step is a spike: ``median + mads x max(sigma, SPREAD_FLOOR x median)``."""
    return base.median + mads * max(base.sigma, SPREAD_FLOOR * abs(base.median))


class StepRule:
    """A finding decided from step signals against their healthy history."""

    name: ClassVar[str]
    signals: ClassVar[tuple[str, ...]]
    """``StepSignals`` fields the rule reads; a step missing one of them is skipped."""

    def __init__(self, window: int, min_history: int, patience: int) -> None:
        self.histories = {name: History(window) for name in self.signals}
        self.min_history = min_history
        self.patience = patience
        self._onset: int | None = None
        self._streak = 0
        self._calm = 0
        """Healthy steps in a row since the last anomalous one."""

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        """The evidence when ``values`` are anomalous against ``bases``, else None."""
        raise NotImplementedError

    def observe(self, signals: StepSignals) -> Observation:
        """Judge one step; a healthy step joins the history, an anomalous one extends the streak."""
        values = {name: getattr(signals, name) for name in self.signals}
        if any(v is None for v in values.values()):
            return HEALTHY
        found = {name: h.baseline() for name, h in self.histories.items()}
        bases = {name: b for name, b in found.items() if b is not None and b.count >= self.min_history}
        evidence = self.verdict(values, bases) if len(bases) == len(found) else None
        if evidence is None:
            for name, value in values.items():
                self.histories[name].add(signals.step, value)
            return self._healthy()
        return self._anomaly(signals.step, evidence)

    def _healthy(self) -> Observation:
        self._streak, self._calm = 0, self._calm + 1
        if self._calm >= self.patience:
            self._onset = None
        return HEALTHY

    def _anomaly(self, step: int, evidence: str) -> Observation:
        self._onset = step if self._onset is None else self._onset
        self._streak, self._calm = self._streak + 1, 0
        return Observation(True, evidence, self._onset, raised=self._streak == self.patience)

    def rewind(self, step: int) -> None:
        """Forget everything after ``step`` (a rollback restored its checkpoint)."""
        for history in self.histories.values():
            history.drop_after(step)
        self._onset, self._streak, self._calm = None, 0, 0


class Collapse(StepRule):
    """A value far below its history: under ``ratio`` x its median."""

    label: ClassVar[str]

    def __init__(self, ratio: float, **kw: int) -> None:
        super().__init__(**kw)
        self.ratio = ratio

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        field = self.signals[0]
        value, base = values[field], bases[field]
        if value >= self.ratio * base.median:
            return None
        return f"{self.label} {value:.3g} is below {self.ratio:g} x its median {base.median:.3g} over {base.steps()}"


class EntropyCollapse(Collapse):
    name, signals, label = "entropy_collapse", ("entropy",), "entropy"


class Spike(StepRule):
    """A value far above its history: above ``spike_limit`` and at least ``floor``."""

    label: ClassVar[str]

    def __init__(self, mads: float, floor: float = 0.0, **kw: int) -> None:
        super().__init__(**kw)
        self.mads, self.floor = mads, floor

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        (field,) = self.signals
        value, base = values[field], bases[field]
        limit = max(spike_limit(base, self.mads), self.floor)
        if value <= limit:
            return None
        return (
            f"{self.label} {value:.3g} is above {limit:.3g} (median {base.median:.3g} + {self.mads:g} x "
            f"spread {max(base.sigma, SPREAD_FLOOR * abs(base.median)):.3g} over {base.steps()})"
        )


class KlSpike(Spike):
    """Also any KL above ``ceiling``: a sampler that drifts far from the trainer step by step never spikes."""

    name, signals, label = "kl_spike", ("kl",), "kl_divergence_inference"

    def __init__(self, mads: float, floor: float, ceiling: float, **kw: int) -> None:
        super().__init__(mads, floor, **kw)
        self.ceiling = ceiling

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        spike = super().verdict(values, bases)
        if spike is not None or values["kl"] <= self.ceiling:
            return spike
        return f"kl_divergence_inference {values['kl']:.3g} is above health_kl_spike_max {self.ceiling:g}"


class GradNormSpike(Spike):
    name, signals, label = "grad_norm_spike", ("grad_norm",), "grad_norm"


class LengthBlowup(StepRule):
    name, signals = "length_blowup", ("completion_tokens", "truncated_share")

    def __init__(self, ratio: float, truncated: float, **kw: int) -> None:
        super().__init__(**kw)
        self.ratio, self.truncated = ratio, truncated
        self.start = History(kw["window"], first_only=True)
        """The run's first healthy truncation shares: a share that creeps up step by step (a length
        exploit being learned) never jumps against its recent median, but it does leave where it started:
        a finding once it is at least halfway from there to every completion truncated. A run that
        started with ``truncated`` or more at the limit has no such room: its truncation is no evidence
        of growth (a ``max_tokens`` too small for the task from step 1 is not a blow-up)."""

    def observe(self, signals: StepSignals) -> Observation:
        seen = super().observe(signals)
        if not seen.anomalous and signals.truncated_share is not None:
            self.start.add(signals.step, signals.truncated_share)
        return seen

    def rewind(self, step: int) -> None:
        super().rewind(step)
        self.start.drop_after(step)

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        length, base = values["completion_tokens"], bases["completion_tokens"]
        if length > self.ratio * base.median:
            return (
                f"mean completion length {length:.1f} tokens is above {self.ratio:g} x its median "
                f"{base.median:.1f} over {base.steps()}"
            )
        share, start = values["truncated_share"], self.start.baseline()
        if start is None or start.median >= self.truncated:  # no room to grow into a majority
            return None
        if share >= self.truncated and share >= (1 + start.median) / 2:
            return (
                f"{share:.0%} of completions hit the token limit (median {start.median:.0%} over the "
                f"run's first healthy {start.steps()}); mean length {length:.1f} tokens"
            )
        return None


class LengthCollapse(Collapse):
    name, signals, label = "length_collapse", ("completion_tokens",), "mean completion length (tokens)"


class DegenerateOutputs(StepRule):
    name, signals = "degenerate_outputs", ("mode_share",)

    def __init__(self, share: float, **kw: int) -> None:
        super().__init__(**kw)
        self.share = share
        self.text = ""

    def observe(self, signals: StepSignals) -> Observation:
        self.text = signals.mode_text
        return super().observe(signals)

    def verdict(self, values: dict[str, float], bases: dict[str, Baseline]) -> str | None:
        share, base = values["mode_share"], bases["mode_share"]
        if share < self.share or base.median >= self.share / 2:
            return None
        shown = self.text if len(self.text) <= 60 else self.text[:59] + "…"
        return (
            f"{share:.0%} of the step's prompts got the same completion {shown!r} "
            f"(median {base.median:.0%} over {base.steps()})"
        )


class Nonfinite(StepRule):
    """Needs no history: a NaN or infinite loss, gradient norm, entropy or KL is never healthy."""

    name, signals = "nonfinite", ()

    def observe(self, signals: StepSignals) -> Observation:
        if not signals.nonfinite:
            return self._healthy()
        return self._anomaly(signals.step, f"non-finite {', '.join(signals.nonfinite)}")


class RewardSaturation:
    """``reward_saturated``: nearly every recent finished group scored all its samples alike."""

    name = "reward_saturated"

    def __init__(self, groups: int, share: float) -> None:
        self._recent: deque[bool] = deque(maxlen=groups)
        self.share = share
        self._onset: int | None = None

    def observe(self, rewards: Sequence[float], step: int) -> Observation:
        """One finished group's rewards, reported for ``step``."""
        if len(rewards) < 2:
            return HEALTHY
        self._recent.append(all(math.isclose(r, rewards[0]) for r in rewards))
        full = len(self._recent) == self._recent.maxlen
        flat = sum(self._recent) / len(self._recent)
        if not full or flat < self.share:
            self._onset = None
            return HEALTHY
        raised = self._onset is None
        onset = self._onset = step if self._onset is None else self._onset
        evidence = (
            f"{flat:.0%} of the last {len(self._recent)} finished groups got the same reward for every "
            "sample (no learning signal)"
        )
        return Observation(True, evidence, onset, raised=raised)

    def rewind(self, step: int) -> None:
        self._recent.clear()
        self._onset = None


def step_rules(cfg: TelescopeConfig) -> list[StepRule]:
    """The step rules whose action is not ``off``, tuned by ``cfg``'s ``health_*`` fields."""
    kw = {
        "window": cfg.health_window_steps,
        "min_history": cfg.health_min_history_steps,
        "patience": cfg.health_patience_steps,
    }
    rules: list[StepRule] = [
        EntropyCollapse(cfg.health_entropy_collapse_ratio, **kw),
        KlSpike(cfg.health_kl_spike_mads, cfg.health_kl_spike_min, cfg.health_kl_spike_max, **kw),
        GradNormSpike(cfg.health_grad_norm_spike_mads, **kw),
        LengthBlowup(cfg.health_length_blowup_ratio, cfg.health_length_blowup_truncated_share, **kw),
        LengthCollapse(cfg.health_length_collapse_ratio, **kw),
        DegenerateOutputs(cfg.health_degenerate_outputs_share, **kw),
        Nonfinite(window=1, min_history=0, patience=1),
    ]
    return [r for r in rules if getattr(cfg, f"health_{r.name}_action") != "off"]
