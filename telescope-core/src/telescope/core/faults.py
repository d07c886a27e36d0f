"""Fault injection: make a real run suffer named faults, to test and measure how it copes.

Set ``TELESCOPE_FAULTS`` to a comma-separated spec before the run starts; the driver passes
it to every Ray worker (the run's ``runtime_env``). Entries are ``name@N`` or ``name=value``:

- ``train_step_raise@N``: every trainer rank raises ``InjectedFault`` in training step N (1-based).
- ``train_loss_nan@N``: every trainer rank trains step N on NaN advantages: its loss, gradients
  and gradient norm are NaN (the backend skips the optimizer step), the run goes on.
- ``prompt_raise@N``: preparing the N-th prompt of the run (1-based) raises.
- ``request_fail=P``: each inference request fails with probability P; which ones is decided by
  a hash of the request id, so a rerun fails the same requests.
- ``reward_raise=ENV``: every reward of environment ENV raises (``*``: every environment).
- ``reward_hang=ENV``: every reward of ENV hangs until the environment's ``reward_timeout_s``.
- ``server_slow=S``: every inference request waits S seconds before it is sent.
- ``server_kill@N``: inference server 0 is SIGKILLed once training step N ended (the run
  restarts it, up to ``inference_max_restarts`` times).
- ``server_error=P``: each inference request is answered 503 with probability P (an
  infrastructure failure: the sample is retried or masked, never scored).
- ``sandbox_create_fail=P``: each sandbox creation fails with probability P (a provider 503).
- ``sandbox_exec_kill=P``: each command run in a sandbox has its sandbox terminated by the
  provider with probability P (``SandboxNotRunningError``: the infrastructure's, not the code's).

``injected`` counts, per fault name, how many times each probabilistic fault fired in this
process (the driver's: sandboxes and requests are the driver's), to compare with what the run
counted.

Example: ``TELESCOPE_FAULTS=train_step_raise@3,request_fail=0.1``. The checks below are called
only by one seam per layer, installed when the run is assembled and only when the variable is
set (``inference/faults.py``, ``env/faults.py``, ``runtime/supervision/faults.py``): unset, the
run has no fault checks at all.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ENV_VAR", "FaultSpec", "FaultSpecError", "InjectedFault", "current", "parse"]

ENV_VAR = "TELESCOPE_FAULTS"


class FaultSpecError(ValueError):
    """``TELESCOPE_FAULTS`` does not parse."""


class InjectedFault(RuntimeError):
    """A failure ``TELESCOPE_FAULTS`` asked for (never raised when it is unset)."""


class FaultSpec(BaseModel):
    """The faults of one run, parsed from ``TELESCOPE_FAULTS``."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    train_step_raise: int | None = Field(default=None, ge=1)
    """Training step (1-based) in which every trainer rank raises."""
    train_loss_nan: int | None = Field(default=None, ge=1)
    """Training step (1-based) whose advantages are NaN on every rank (a non-finite loss)."""
    prompt_raise: int | None = Field(default=None, ge=1)
    """The N-th prompt prepared in the run (1-based) fails to prepare."""
    request_fail: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that an inference request fails (reproducible per request id)."""
    reward_raise: str | None = None
    """Environment whose every reward raises (``*``: all of them)."""
    reward_hang: str | None = None
    """Environment whose every reward hangs until its timeout (``*``: all of them)."""
    server_slow: float = Field(default=0.0, ge=0.0)
    """Seconds every inference request waits before it is sent."""
    server_kill: int | None = Field(default=None, ge=1)
    """Training step (1-based) after which inference server 0 is SIGKILLed."""
    server_error: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that an inference request is answered 503 (reproducible per request id)."""
    sandbox_create_fail: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a sandbox creation fails (the N-th creation of the process: reproducible)."""
    sandbox_exec_kill: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that the provider terminates a sandbox while it runs a command."""


def parse(spec: str) -> FaultSpec:
    """``"train_step_raise@3,request_fail=0.1"`` -> ``FaultSpec``; a clear ``FaultSpecError`` otherwise."""
    fields: dict[str, str] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        sep = "@" if "@" in entry else "=" if "=" in entry else None
        if sep is None:
            raise FaultSpecError(f"{ENV_VAR}: entry {entry!r} needs a value: write name@N or name=value")
        name, value = (part.strip() for part in entry.split(sep, 1))
        if name in fields:
            raise FaultSpecError(f"{ENV_VAR}: {name!r} is given twice in {spec!r}")
        fields[name] = value
    try:
        return FaultSpec.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        known = ", ".join(FaultSpec.model_fields)
        raise FaultSpecError(f"{ENV_VAR}={spec!r}: {problems} (known faults: {known})") from None


_cache: tuple[str, FaultSpec] | None = None
fired: dict[str, float] = {}
"""When each fault first fired in this process (unix time; ``bench/faults.py`` measures from it)."""
injected: Counter[str] = Counter()
"""How many times each probabilistic fault fired in this process."""


def _fire(name: str, message: str) -> InjectedFault:
    fired.setdefault(name, time.time())
    return InjectedFault(f"{ENV_VAR}: {message}")


def current() -> FaultSpec | None:
    """The faults this process should inject, or None (the common case: ``TELESCOPE_FAULTS`` unset)."""
    global _cache
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return None
    if _cache is None or _cache[0] != spec:
        _cache = (spec, parse(spec))
    return _cache[1]


# --- the checks the seams call -------------------------------------------------------------
def on_train_step(step: int) -> None:
    """Trainer ranks, before training step ``step`` (1-based)."""
    faults = current()
    if faults is not None and faults.train_step_raise == step:
        raise _fire("train_step_raise", f"train_step_raise@{step}")


def nan_loss_in(step: int) -> bool:
    """Trainer ranks, before training step ``step`` (1-based): whether its advantages become NaN."""
    faults = current()
    if faults is None or faults.train_loss_nan != step:
        return False
    fired.setdefault("train_loss_nan", time.time())
    return True


def on_prepare_prompt(count: int) -> None:
    """The driver, before preparing the ``count``-th prompt of the run (1-based)."""
    faults = current()
    if faults is not None and faults.prompt_raise == count:
        raise _fire("prompt_raise", f"prompt_raise@{count}")


def kill_server_after(step: int) -> int | None:
    """The driver, after training step ``step``: the index of the server to SIGKILL now, if any."""
    faults = current()
    if faults is None or faults.server_kill != step:
        return None
    fired.setdefault("server_kill", time.time())
    return 0


async def on_request(request_id: str) -> None:
    """The driver, before sending inference request ``request_id``."""
    faults = current()
    if faults is None:
        return
    if faults.server_slow:
        await asyncio.sleep(faults.server_slow)
    if faults.request_fail and zlib.crc32(request_id.encode()) / 2**32 < faults.request_fail:
        raise _fire("request_fail", f"request_fail={faults.request_fail} failed request {request_id}")


def draw(name: str, probability: float, key: str) -> bool:
    """Whether fault ``name`` fires for ``key`` (a hash of both below ``probability``: reproducible);
    counted in ``injected`` when it does."""
    if not probability or zlib.crc32(f"{name}:{key}".encode()) / 2**32 >= probability:
        return False
    fired.setdefault(name, time.time())
    injected[name] += 1
    return True


async def on_reward(env_name: str) -> None:
    """Inside an environment's reward computation (its timeout and error handling apply)."""
    faults = current()
    if faults is None:
        return
    if faults.reward_hang in (env_name, "*"):
        fired.setdefault("reward_hang", time.time())
        await asyncio.Event().wait()  # until the reward timeout cancels it
    if faults.reward_raise in (env_name, "*"):
        raise _fire("reward_raise", f"reward_raise={faults.reward_raise}")


def propagate(env_vars: dict[str, Any]) -> None:
    """Add this process's ``TELESCOPE_FAULTS`` to a Ray ``runtime_env``'s ``env_vars``."""
    spec = os.environ.get(ENV_VAR)
    if spec:
        parse(spec)  # a typo fails the run at start-up, in the driver, not later in a worker
        env_vars.setdefault(ENV_VAR, spec)
