"""Infrastructure failures: what failed under a sample that was not the model's doing.

A sandbox that could not be created, a provider that timed out or answered 5xx, a sandbox the
provider killed for memory, an inference server that died mid-request, a gateway call that failed
for a transport reason: these are the infrastructure's, and a sample they hit is retried or
masked, never scored 0 (``rollouts/outcomes.py``). The model's code crashing, its tests timing
out and wrong answers stay results the reward scores.

The layer where such a failure happens decides it is one: it raises an ``InfraError`` made by
``failure``, or marks the exception it raises anyway (``mark``: callers keep branching on its
class, e.g. a sandbox that is gone), and either counts it (per cause, provider and environment) in this process's ``ORIGINS``: a
failure a lower layer absorbs (a sandbox pool creating another sandbox) is counted as well as one
that reaches a sample. The run takes the counts once per step (``ORIGINS.drain``).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "CAUSES",
    "GATEWAY_CODE_PREFIX",
    "ORIGINS",
    "InfraCause",
    "InfraError",
    "Origin",
    "attributed_to",
    "env_name",
    "failure",
    "gateway_call_failure",
    "infra_cause",
    "mark",
    "summary",
]

InfraCause = Literal[
    "sandbox_create",
    "sandbox_lost",
    "sandbox_oom",
    "provider_timeout",
    "provider_error",
    "server_error",
    "server_died",
    "gateway_transport",
    "compaction_failed",
    "teacher_error",
]
CAUSES: tuple[str, ...] = get_args(InfraCause)
"""Every cause, in the order the metrics and ``runs show`` list them."""
GATEWAY_CODE_PREFIX = "infra:"
"""The gateway answers an infrastructure failure 502 with ``code`` ``infra:<cause>:<provider>``."""


class InfraError(RuntimeError):
    """A failure of the infrastructure under a sample (``cause``, ``provider``): never the model's."""

    def __init__(self, message: str, *, cause: InfraCause, provider: str) -> None:
        if cause not in CAUSES:
            raise ValueError(f"InfraError: cause {cause!r} is not one of {', '.join(CAUSES)}")
        super().__init__(message)
        self.cause: InfraCause = cause
        self.provider = provider


@dataclass(frozen=True)
class Origin:
    """Where infrastructure failures happened: one count key."""

    cause: str
    provider: str
    env: str
    """The environment whose sample the failing call served ("" when none was attributed)."""


class OriginCounts:
    """Infrastructure failures counted where they happened, until the run drains them (thread-safe:
    rewards may run on threads of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[Origin] = Counter()

    def add(self, cause: str, provider: str) -> None:
        with self._lock:
            self._counts[Origin(cause, provider, _ENV.get())] += 1

    def drain(self) -> Counter[Origin]:
        """The counts since the last drain (and forget them)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts


ORIGINS = OriginCounts()

_ENV: ContextVar[str] = ContextVar("telescope_infra_env", default="")


def attributed_to(env: str) -> None:
    """Count this context's infrastructure failures (and its tasks') under environment ``env``."""
    _ENV.set(env)


def env_name() -> str:
    """The environment this context's calls are attributed to ("" when none: ``attributed_to``)."""
    return _ENV.get()


def failure(message: str, *, cause: InfraCause, provider: str) -> InfraError:
    """An ``InfraError`` to raise, counted in ``ORIGINS`` (call it once, where the failure happened)."""
    error = InfraError(message, cause=cause, provider=provider)
    ORIGINS.add(cause, provider)
    return error


def mark(exc: BaseException, *, cause: InfraCause, provider: str, count: bool = True) -> InfraError:
    """Mark ``exc`` as an infrastructure failure (``infra_cause`` finds it), counted unless ``count``
    is False (a failure already counted where it happened, summarised again); returns the mark."""
    message = f"{type(exc).__name__}: {exc}"
    error = (
        failure(message, cause=cause, provider=provider)
        if count
        else InfraError(message, cause=cause, provider=provider)
    )
    exc.infra_failure = error  # type: ignore[attr-defined]
    return error


def infra_cause(exc: BaseException) -> InfraError | None:
    """The infrastructure failure ``exc`` is, carries (``mark``) or was raised from (``raise ... from``),
    else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, InfraError):
            return current
        marked = getattr(current, "infra_failure", None)
        if isinstance(marked, InfraError):
            return marked
        seen.add(id(current))
        current = current.__cause__
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in out):
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def gateway_call_failure(exc: BaseException, gateway_url: str) -> InfraError | None:
    """The infrastructure failure ``exc`` is when it comes from (or was raised from) an OpenAI
    client's call to the gateway at ``gateway_url`` that failed for a transport reason (connection
    refused or reset, a timeout, a 5xx), marked on ``exc``: the cause the gateway's 502 names (counted
    there, ``gateway.errors.infra_code``), else ``gateway_transport`` (counted here). None for anything
    else (a refused or malformed call, the agent's own code or services)."""
    openai = sys.modules.get("openai")
    if openai is None:  # no OpenAI client was ever used in this process
        return None
    base = gateway_url.rstrip("/")
    for error in _chain(exc):
        request = getattr(error, "request", None)
        if not isinstance(error, openai.APIError) or not str(getattr(request, "url", "")).startswith(base):
            continue
        if isinstance(error, openai.APIConnectionError):  # refused, reset, timed out (APITimeoutError)
            return mark(exc, cause="gateway_transport", provider="gateway")
        if isinstance(error, openai.APIStatusError) and error.status_code >= 500:
            code = str(error.code or "")
            cause, _, provider = code.removeprefix(GATEWAY_CODE_PREFIX).partition(":")
            if code.startswith(GATEWAY_CODE_PREFIX) and cause in CAUSES:  # counted by the gateway
                return mark(exc, cause=cause, provider=provider or "gateway", count=False)  # type: ignore[arg-type]
            return mark(exc, cause="gateway_transport", provider="gateway")
    return None


def summary(metrics: dict[str, float]) -> str | None:
    """``infra 12 failed (10 retried, 2 masked): sandbox_create 8, server_error 4`` from a step's
    ``totals/infra/*`` metrics (the run so far); None while nothing failed."""
    totals = {k.removeprefix("totals/infra/"): v for k, v in metrics.items() if k.startswith("totals/infra/")}
    failed = int(totals.get("failed", 0))
    causes = [(c, int(totals.get(f"cause/{c}", 0))) for c in CAUSES]
    counted = ", ".join(f"{c} {n}" for c, n in causes if n)
    if not failed and not counted:
        return None
    retried, masked = int(totals.get("retried", 0)), int(totals.get("masked", 0))
    return f"infra {failed} failed ({retried} retried, {masked} masked)" + (f": {counted}" if counted else "")
