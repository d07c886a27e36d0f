"""A teacher is an inference pool: the logprob it gives each of a sequence's tokens (distillation).

``TeacherClient`` asks any OpenAI-compatible endpoint that answers ``/v1/completions`` with vLLM's
``prompt_logprobs`` (vLLM, a Telescope engine server, ``telescope serve``) for the logprobs of given
token ids: prompt + completion are sent as one token-id prompt, and the completion's positions are
read back, the exact sampled ids, never text. Sequences finishing together are sent in one request
(up to ``batch_size``; while ``MAX_IN_FLIGHT`` requests are out, newcomers wait and go together), so
scoring overlaps with the generation still running. A request that fails or times out is retried;
after ``max_retries`` it raises ``TeacherError`` marked as an infrastructure failure (cause
``teacher_error``, provider ``teacher``, counted once per request): each of its samples is retried,
then masked, like any other (``rollouts/outcomes.py``). A sequence is never given a made-up signal.
An answer no retry can fix (a 4xx: a wrong key, model or request; no ``prompt_logprobs``) raises
unmarked at once: the setup's, not the infrastructure's (its group is discarded, ``rollout_error``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from telescope.core import infra
from telescope.core.inference.client import prompt_logprob_ids

__all__ = [
    "API_KEY_ENV",
    "TeacherClient",
    "TeacherCounts",
    "TeacherError",
    "TeacherSequence",
    "completions_url",
]

log = logging.getLogger("telescope.distill")

#: Environment variable with the bearer token of a remote teacher (``distill_teacher_base_url``).
API_KEY_ENV = "TELESCOPE_TEACHER_API_KEY"
#: Teacher requests out at once; sequences arriving meanwhile are batched into the next one.
MAX_IN_FLIGHT = 2
#: Retry waits: ``RETRY_BASE_S * 2**attempt``, at most ``RETRY_MAX_S``.
RETRY_BASE_S, RETRY_MAX_S = 0.5, 10.0
#: Statuses a retry cannot fix (the request itself is wrong): they fail at once.
FINAL_STATUSES = frozenset({400, 401, 403, 404, 422})


class TeacherError(RuntimeError):
    """The teacher could not score a sequence: after every retry, an infrastructure failure (marked:
    the sample is retried, then masked); at once, when the request itself is wrong (unmarked)."""


@dataclass(frozen=True)
class TeacherSequence:
    """One trained sequence to score: the teacher judges ``completion_ids`` given ``prompt_ids``."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]


@dataclass
class TeacherCounts:
    """What the teacher did so far in this run (cumulative)."""

    requests: int = 0
    sequences: int = 0
    retries: int = 0
    failures: int = 0
    """Sequences given up (each an infrastructure failure of its sample, unless the request was wrong)."""

    def metrics(self) -> dict[str, float]:
        return {
            "distill/teacher_requests": float(self.requests),
            "distill/teacher_retries": float(self.retries),
            "distill/teacher_failures": float(self.failures),
        }


class _Attempt(Exception):
    """One failed try (retried unless ``final``)."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass
class TeacherClient:
    """Scores sequences with the teacher at ``base_urls`` (each serving ``model``; requests take turns)."""

    base_urls: list[str]
    model: str
    timeout_s: float = 120.0
    max_retries: int = 3
    batch_size: int = 64
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every request: the run's secret for a local pool, else ``API_KEY_ENV``'s bearer token."""
    counts: TeacherCounts = field(default_factory=TeacherCounts)
    _pending: list[tuple[TeacherSequence, asyncio.Future[list[float]]]] = field(default_factory=list)
    _in_flight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _session: aiohttp.ClientSession | None = None
    _turn: int = 0

    @classmethod
    def remote(cls, base_url: str, model: str, **kwargs: Any) -> TeacherClient:
        """A teacher outside the run: its bearer token (if any) from ``API_KEY_ENV``, never the run's secret."""
        key = os.environ.get(API_KEY_ENV, "")
        return cls([base_url], model, headers={"Authorization": f"Bearer {key}"} if key else {}, **kwargs)

    async def score(self, sequences: Sequence[TeacherSequence]) -> list[list[float]]:
        """The teacher's logprob of every completion token of each sequence (raises ``TeacherError``)."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in sequences]
        self._pending += list(zip(sequences, futures, strict=True))
        self._send_pending()
        return list(await asyncio.gather(*futures))  # gather: every future's exception is retrieved

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _send_pending(self) -> None:
        while self._pending and self._in_flight < MAX_IN_FLIGHT * len(self.base_urls):
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
            self._in_flight += 1
            task = asyncio.create_task(self._send(batch), name="teacher request")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[TeacherSequence, asyncio.Future[list[float]]]]) -> None:
        try:
            results = await self._with_retries([s for s, _ in batch])
        except TeacherError as exc:
            self.counts.failures += len(batch)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._in_flight -= 1
            self._send_pending()

    async def _with_retries(self, sequences: list[TeacherSequence]) -> list[list[float]]:
        for attempt in range(self.max_retries + 1):
            try:
                return await self._request(sequences)
            except _Attempt as exc:
                if exc.final or attempt == self.max_retries:
                    error = TeacherError(
                        f"teacher {self.model!r} at {', '.join(self.base_urls)} failed to score {len(sequences)} "
                        f"sequence(s) after {attempt + 1} attempt(s): {exc}"
                    )
                    if not exc.final:  # the teacher's failure, not the request's: retried, then masked
                        infra.mark(error, cause="teacher_error", provider="teacher")
                    raise error from None
                self.counts.retries += 1
                log.warning("teacher request failed (attempt %d, retrying): %s", attempt + 1, exc)
                await asyncio.sleep(min(RETRY_BASE_S * 2**attempt, RETRY_MAX_S))
        raise AssertionError("unreachable")

    async def _request(self, sequences: list[TeacherSequence]) -> list[list[float]]:
        body = {
            "model": self.model,
            "prompt": [[*s.prompt_ids, *s.completion_ids] for s in sequences],
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        }
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self.counts.requests += 1
        self.counts.sequences += len(sequences)
        url = completions_url(self.base_urls[self._turn % len(self.base_urls)])
        self._turn += 1
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self._session.post(url, json=body, headers=self.headers, timeout=timeout) as resp:
                payload = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise _Attempt(
                        f"HTTP {resp.status}: {str(payload)[:300]}", final=resp.status in FINAL_STATUSES
                    )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise _Attempt(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        return _completion_logprobs(payload, sequences)


def completions_url(base_url: str) -> str:
    """``/v1/completions`` under ``base_url``, given with or without OpenAI's ``/v1`` suffix."""
    base = base_url.rstrip("/")
    return base + ("/completions" if base.endswith("/v1") else "/v1/completions")


def _completion_logprobs(payload: Any, sequences: list[TeacherSequence]) -> list[list[float]]:
    """Each sequence's completion-token logprobs out of a completions answer (prompt positions skipped)."""
    try:
        choices = sorted(payload["choices"], key=lambda c: c["index"])
    except (KeyError, TypeError) as exc:
        raise _Attempt(f"answer has no choices ({type(exc).__name__}: {exc})") from None
    if len(choices) != len(sequences):
        raise _Attempt(f"asked for {len(sequences)} sequences, got {len(choices)} choices")
    out = []
    for i, (choice, seq) in enumerate(zip(choices, sequences, strict=True)):
        rows = prompt_logprob_ids(choice.get("prompt_logprobs"))
        ids = [*seq.prompt_ids, *seq.completion_ids]
        if rows is None or len(rows) != len(ids):
            got = "none" if rows is None else len(rows)
            raise _Attempt(
                f"sequence {i}: {len(ids)} tokens sent, prompt_logprobs for {got} positions (the endpoint "
                "must support vLLM's prompt_logprobs)",
                final=rows is None,
            )
        start = len(seq.prompt_ids)
        values = []
        for t in range(start, len(ids)):
            row = rows[t] or {}
            if ids[t] not in row:
                raise _Attempt(f"sequence {i}: no logprob for token id {ids[t]} at position {t}", final=True)
            values.append(row[ids[t]])
        out.append(values)
    return out
