"""Sample outcomes: every sample ends as ``model`` (scored), ``infra`` (retried, then masked) or
``cancelled`` (stale); only ``model`` outcomes reach advantages.

An infrastructure failure (``telescope.core.infra.InfraError``, decided where it happened: the
sandbox layer, the inference client, the fault seams) never scores 0. The sample runs again after
a backoff, at most ``infra_max_retries_per_sample`` times; then it is masked: its group trains on
its remaining samples (advantages over them), and is dropped only when fewer than 2 remain.

``InfraLedger`` counts it all per step (``infra/failed``, ``infra/retried``, ``infra/masked``, each
also per environment and provider, and ``infra/cause/<cause>`` for every failure counted where it
happened, ``infra.ORIGINS``) and watches the failure rate: above ``infra_max_failure_rate`` over
the last ``infra_failure_window`` sample attempts, the run ends with one line naming the provider
and the cause.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from telescope.core.infra import ORIGINS, InfraError

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["MAX_BACKOFF_S", "InfraLedger", "InfraPolicy", "InfraRateError", "OutcomeKind"]

OutcomeKind = Literal["model", "infra", "cancelled"]

MAX_BACKOFF_S = 60.0
"""The longest wait before a retry, however many retries came before."""


@dataclass(frozen=True)
class InfraPolicy:
    """How a run treats a sample hit by an infrastructure failure (the ``infra_*`` settings)."""

    max_retries: int
    backoff_s: float
    max_failure_rate: float
    window: int

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> InfraPolicy:
        return cls(
            cfg.infra_max_retries_per_sample,
            cfg.infra_retry_backoff_s,
            cfg.infra_max_failure_rate,
            cfg.infra_failure_window,
        )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): doubling, at most ``MAX_BACKOFF_S``."""
        return float(min(self.backoff_s * 2 ** (retry - 1), MAX_BACKOFF_S))


class InfraRateError(RuntimeError):
    """Too many sample attempts failed for the infrastructure: the run ends (one line says why)."""

    complete_reason = True
    """The message names the rate, the provider and the cause: nothing beneath it says more."""


@dataclass(frozen=True)
class _Failure:
    """One sample attempt that an infrastructure failure ended."""

    env: str
    provider: str
    cause: str


class InfraLedger:
    """A run's infrastructure outcomes: decides retry or mask, counts per step, watches the rate."""

    def __init__(self, policy: InfraPolicy) -> None:
        self.policy = policy
        self.totals: Counter[str] = Counter()
        """``failed``, ``retried``, ``masked`` and ``cause/<cause>`` since the run started."""
        self._step: Counter[str] = Counter()
        self._window: deque[_Failure | None] = deque(maxlen=policy.window)
        """The last sample attempts: the failure that ended each, None for one that finished."""

    def attempt_finished(self) -> None:
        """A sample attempt ended as the model's outcome (scored) or for a reason not the infrastructure's."""
        self._window.append(None)

    def failed(self, env: str, error: InfraError, retries_done: int) -> bool:
        """An attempt of a sample of ``env`` ended with ``error`` after ``retries_done`` retries:
        True to retry it (after ``policy.backoff(retries_done + 1)``), False to mask it."""
        failure = _Failure(env, error.provider, error.cause)
        self._window.append(failure)
        retry = retries_done < self.policy.max_retries
        self._count("failed", failure)
        self._count("retried" if retry else "masked", failure)
        return retry

    def group_hit(self) -> None:
        """A group's first infrastructure failure: dropping whole groups would generate it all again
        (``infra/groups_hit`` x ``group_size``, against ``infra/retried`` samples run again here)."""
        self._step["groups_hit"] += 1
        self.totals["groups_hit"] += 1

    def _count(self, what: str, failure: _Failure) -> None:
        for key in (what, f"env/{failure.env}/{what}", f"provider/{failure.provider}/{what}"):
            self._step[key] += 1
            self.totals[key] += 1

    def rate_exceeded(self) -> InfraRateError | None:
        """The error ending the run when the failure rate over a full window is above the limit."""
        window = self._window
        failures = [f for f in window if f is not None]
        if len(window) < self.policy.window or len(failures) <= self.policy.max_failure_rate * len(window):
            return None
        (provider, cause), n = Counter((f.provider, f.cause) for f in failures).most_common(1)[0]
        return InfraRateError(
            f"infrastructure failures: {len(failures)} of the last {len(window)} sample attempts "
            f"({len(failures) / len(window):.0%}) failed, above infra_max_failure_rate="
            f"{self.policy.max_failure_rate:g}; most of them ({n}) provider '{provider}', cause '{cause}': "
            "fix that provider (or raise infra_max_failure_rate)"
        )

    def step_metrics(self) -> dict[str, float]:
        """``infra/*`` of the step now ending (the failures counted where they happened included),
        ``totals/infra/*`` since the run started; then a new step starts counting."""
        for origin, n in ORIGINS.drain().items():
            for key in (f"cause/{origin.cause}", f"provider/{origin.provider}/cause/{origin.cause}"):
                self._step[key] += n
                self.totals[key] += n
        out = {f"infra/{what}": 0.0 for what in ("failed", "retried", "masked", "groups_hit")}
        out.update({f"infra/{key}": float(n) for key, n in self._step.items()})
        out.update({f"totals/infra/{key}": float(n) for key, n in self.totals.items() if "/" not in key})
        out.update(
            {f"totals/infra/{key}": float(n) for key, n in self.totals.items() if key.startswith("cause/")}
        )
        self._step = Counter()
        return out

    def state_dict(self) -> dict[str, Any]:
        """The run totals (a checkpoint's orchestrator state)."""
        return dict(self.totals)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = Counter({k: int(v) for k, v in state.items()})
