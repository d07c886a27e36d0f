"""Rubric: a weighted sum of reward functions that can never crash a run.

Each function receives only the keyword arguments it declares (``completion``, ``sample``,
``state``, ``answer``, ``metadata``, ``eos_token``, ``messages``; ``**kwargs`` gets them
all), may be sync or async, and returns a number or ``(number, golden_answer)``. Each runs
under a timeout; an exception, a timeout or a non-finite value scores 0 and is counted in
the sample metrics as ``reward_error`` / ``reward_timeout`` with the message in
``info_turns``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from telescope.core.env import reward_log
from telescope.core.env.threads import run_in_daemon_thread
from telescope.core.env.types import RewardResult, RolloutState, Sample, info_turn

__all__ = ["RewardFunc", "Rubric"]

RewardFunc = Callable[..., Any]


@dataclass(frozen=True)
class _Entry:
    func: RewardFunc
    name: str
    weight: float
    golden_answer: str | None
    range_min: float | None
    range_max: float | None
    invert: bool
    timeout_s: float
    params: frozenset[str]
    takes_all: bool


def _signature_params(func: RewardFunc) -> tuple[frozenset[str], bool]:
    sig = inspect.signature(func)
    names = frozenset(
        p.name for p in sig.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    )
    takes_all = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return names, takes_all


class Rubric:
    """Weighted reward functions.

    Args:
        timeout_s: default per-function timeout in seconds. Sync functions run on daemon
            threads; one that times out is abandoned (Python threads cannot be killed) and
            never blocks interpreter exit.
    """

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"Rubric timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.entries: list[_Entry] = []

    def add_reward(
        self,
        func: RewardFunc,
        weight: float = 1.0,
        *,
        name: str | None = None,
        golden_answer: str | None = None,
        range_min: float | None = None,
        range_max: float | None = None,
        invert: bool = False,
        timeout_s: float | None = None,
    ) -> Rubric:
        """Add a reward function (weight 0 records it without adding to the total)."""
        fname = name or getattr(func, "__name__", "reward").lstrip("_")
        if any(e.name == fname for e in self.entries):
            raise ValueError(f"Rubric already has a function named '{fname}'; pass name=...")
        params, takes_all = _signature_params(func)
        entry = _Entry(
            func,
            fname,
            float(weight),
            golden_answer,
            range_min,
            range_max,
            invert,
            float(timeout_s or self.timeout_s),
            params,
            takes_all,
        )
        self.entries.append(entry)
        return self

    def add_metric(self, func: RewardFunc, **kwargs: Any) -> Rubric:
        """Record ``func``'s value in the sample metrics without adding it to the total."""
        return self.add_reward(func, 0.0, **kwargs)

    @property
    def metrics_ranges(self) -> dict[str, dict[str, Any]]:
        """``{name: {"min", "max", "invert"}}`` for entries that declare a range."""
        ranges: dict[str, dict[str, Any]] = {}
        for e in self.entries:
            if e.range_min is None and e.range_max is None and not e.invert:
                continue
            ranges[e.name] = {"min": e.range_min, "max": e.range_max, "invert": e.invert}
        return ranges

    @property
    def reward_max(self) -> float:
        """Sum of positive weights times declared maxima (entries without a max count 1)."""
        return sum(
            e.weight * (1.0 if e.range_max is None else e.range_max) for e in self.entries if e.weight > 0
        )

    async def score(
        self,
        *,
        completion: str | None = None,
        sample: Sample | None = None,
        state: RolloutState | None = None,
        eos_token: str = "",
        extra_sample_metrics: dict[str, float] | None = None,
        extra_golden_answers: dict[str, str | None] | None = None,
        extra_info_turns: list[dict[str, Any]] | None = None,
        extra_sample_tags: dict[str, str] | None = None,
    ) -> RewardResult:
        """Run every function (concurrently) and combine them into a ``RewardResult``."""
        if sample is None and state is not None:
            sample = state.sample
        available: dict[str, Any] = {
            "completion": completion,
            "sample": sample,
            "state": state,
            "answer": sample.answer if sample is not None else None,
            "metadata": sample.metadata if sample is not None else None,
            "eos_token": eos_token,
            "messages": state.last_messages() if state is not None else None,
        }
        if len(self.entries) == 1:  # one function: no task to gather (a driver scores thousands a second)
            outcomes = [await self._run(self.entries[0], available)]
        else:
            outcomes = await asyncio.gather(*(self._run(e, available) for e in self.entries))
        result = RewardResult(total_reward=0.0)
        errors = timeouts = 0
        for entry, (value, golden, problem) in zip(self.entries, outcomes, strict=True):
            result.sample_metrics[entry.name] = value
            result.total_reward += entry.weight * value
            if golden is not None or entry.golden_answer is not None:
                result.golden_answers[entry.name] = golden if golden is not None else entry.golden_answer
            if problem is not None:
                kind, message = problem
                errors += kind == "error"
                timeouts += kind == "timeout"
                result.info_turns.append(info_turn(f"reward_{kind}/{entry.name}", message, kind="stderr"))
        result.sample_metrics["reward_error"] = float(errors)
        result.sample_metrics["reward_timeout"] = float(timeouts)
        result.sample_metrics.update(extra_sample_metrics or {})
        result.golden_answers.update(extra_golden_answers or {})
        result.info_turns.extend(extra_info_turns or [])
        result.sample_tags.update(extra_sample_tags or {})
        return result

    async def _run(
        self, entry: _Entry, available: dict[str, Any]
    ) -> tuple[float, str | None, tuple[str, str] | None]:
        if entry.takes_all:
            kwargs = {k: v for k, v in available.items() if v is not None}
        else:
            kwargs = {k: available.get(k) for k in entry.params}
        try:
            async with asyncio.timeout(entry.timeout_s):  # in this task (wait_for would start one)
                raw = await self._call(entry, kwargs)
            value, golden = _unpack(raw)
        except TimeoutError as exc:
            detail = str(exc) or f"no result within {entry.timeout_s}s"
            reward_log.report(entry.name, None, f"timeout: {detail}")
            return 0.0, None, ("timeout", f"{entry.name}: {detail}")
        except Exception as exc:  # noqa: BLE001 - a reward never crashes a run (logged once, counted)
            reward_log.report(entry.name, exc)
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return 0.0, None, ("error", f"{entry.name}: {tb}")
        return value, golden, None

    async def _call(self, entry: _Entry, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(entry.func):
            return await entry.func(**kwargs)
        raw = await run_in_daemon_thread(entry.func, **kwargs)
        return await raw if inspect.isawaitable(raw) else raw


def _unpack(raw: Any) -> tuple[float, str | None]:
    golden = None
    if isinstance(raw, tuple):
        if len(raw) != 2:
            raise TypeError(f"a reward function returned a {len(raw)}-tuple; return value or (value, golden)")
        raw, golden = raw
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"a reward function returned a non-finite value {value!r}")
    return value, None if golden is None else str(golden)
