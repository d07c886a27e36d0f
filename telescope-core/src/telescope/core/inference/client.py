"""Async HTTP client for one inference server (either engine): the orchestrator's single code path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from telescope.core import infra
from telescope.core.cluster.run_secret import auth_headers
from telescope.core.inference.protocol import (
    ENDPOINTS,
    CompletionRequest,
    CompletionResponse,
    WeightSyncInitRequest,
    WeightUpdateResponse,
)
from telescope.core.observe.samplers.prometheus import parse_prometheus
from telescope.core.weights.errors import StaleWeightsError, WeightSyncError, WeightSyncMismatchError

__all__ = ["Completion", "InferenceClient", "InferenceServerError", "engine_metrics", "prompt_logprob_ids"]

#: Metric-name prefixes stripped by ``metrics()``, so both engines report the same keys.
METRIC_PREFIXES = ("vllm:", "telescope:")


class InferenceServerError(RuntimeError):
    """The server answered with an error status (the message carries its explanation)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"inference server error {status}: {message}")


@dataclass
class Completion:
    """One sample as the orchestrator needs it."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str
    prompt_token_ids: list[int] | None
    weight_versions: list[int] | None
    response_id: str | None = None
    """The server's id of the response (vLLM traces name their span after it)."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per token, ``{token id: logprob}`` of its most likely alternatives (requests with ``logprobs`` > 0
    and ``return_tokens_as_token_ids``; None otherwise)."""
    prompt_logprobs: list[dict[int, float] | None] | None = None
    """Per prompt token, ``{token id: logprob}`` of that token and any alternatives (null first: nothing
    predicts it); requests with ``prompt_logprobs``, None otherwise."""


def engine_metrics(text: str) -> dict[str, float]:
    """``/metrics`` text -> ``{name: value}``: series summed over label sets, engine prefixes stripped."""
    out: dict[str, float] = {}
    for name, value in parse_prometheus(text).items():
        for prefix in METRIC_PREFIXES:
            name = name.removeprefix(prefix)
        out[name] = out.get(name, 0.0) + value
    return out


class InferenceClient:
    """Speaks ``inference.protocol`` to one server at ``base_url``; use as an async context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 3600.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.served_version: int | None = None
        """The weight version this server confirmed it loaded (None: not known yet, nothing checked)."""
        self._newest_version: int | None = None  # the newest version asked for (it may be loading now)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._own_session = session is None

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (if this client opened it)."""
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request carrying the run's secret; a POST always says JSON (``{}`` when it has no body):
        servers refuse anything else (``cluster.http_guard``)."""
        kwargs["headers"] = {**auth_headers(), **kwargs.get("headers", {})}
        if method == "POST" and "json" not in kwargs and "data" not in kwargs:
            kwargs["json"] = {}
        async with self._http().request(method, self.base_url + path, **kwargs) as resp:
            body: Any
            if resp.content_type == "application/json":
                body = await resp.json()
            else:
                body = await resp.text()
            if resp.status >= 400:
                raise _error_from(resp.status, body)
            return body

    async def complete(self, prompt: list[int] | str, **params: Any) -> list[Completion]:
        """``/v1/completions`` for one prompt; ``params`` are ``CompletionRequest`` fields.

        Logprobs are always requested. Cancelling the awaiting task closes the connection
        (both engines abort the request on disconnect); ``abort`` also aborts by id.
        """
        params.setdefault("logprobs", 0)
        body = CompletionRequest(prompt=prompt, return_token_ids=True, **params)
        floor = self.served_version
        try:
            raw = await self._request(
                "POST", ENDPOINTS["completions"], json=body.model_dump(exclude_none=True)
            )
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # died mid-request
            infra.mark(exc, cause="server_died", provider="inference")
            raise
        except InferenceServerError as exc:  # the server's own fault: never the sample's
            if exc.status >= 500:
                infra.mark(exc, cause="server_error", provider="inference")
            raise
        response = CompletionResponse.model_validate(raw)
        choices = sorted(response.choices, key=lambda c: c.index)
        completions = [_completion(choice, response.id) for choice in choices]
        for c in completions:
            self.check_sampled_versions(c.weight_versions, floor)
        return completions

    def check_sampled_versions(self, versions: list[int] | None, floor: int | None) -> None:
        """Raise ``StaleWeightsError`` when a completion was sampled with a weight (adapter) version
        older than the one this server had confirmed when the request was sent (``floor``), or one
        never synced: a server that skipped a sync, or kept serving an old adapter, fails the run."""
        if not versions or floor is None:
            return
        ceiling = max(v for v in (self.served_version, self._newest_version, floor) if v is not None)
        bad = [v for v in versions if not floor <= v <= ceiling]
        if bad:
            raise StaleWeightsError(
                f"inference server {self.base_url} sampled with weight version(s) {sorted(set(bad))} but had "
                f"confirmed loading version {floor} before the request (newest synced: {ceiling}): it serves "
                "weights (or a LoRA adapter) other than the trainer's; stopping the run"
            )

    async def abort(self, request_ids: list[str] | None = None) -> int:
        """Abort requests by id (``None`` = all); returns how many the server found."""
        body = {"request_ids": request_ids} if request_ids else {}
        result = await self._request("POST", ENDPOINTS["abort"], json=body)
        return int(result.get("aborted", 0)) if isinstance(result, dict) else 0

    async def pause(self, mode: str = "keep") -> None:
        """Pause scheduling (``keep``: in-flight requests freeze; ``wait``: finish them; ``abort``)."""
        await self._request("POST", ENDPOINTS["pause"], params={"mode": mode})

    async def resume(self) -> None:
        """Resume scheduling."""
        await self._request("POST", ENDPOINTS["resume"])

    async def is_paused(self) -> bool:
        """Whether the server is paused."""
        return bool((await self._request("GET", ENDPOINTS["is_paused"]))["is_paused"])

    async def health(self) -> bool:
        """True when ``/health`` answers 200."""
        try:
            async with self._http().get(self.base_url + ENDPOINTS["health"]) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def wait_healthy(self, timeout_s: float, interval_s: float = 0.5) -> None:
        """Poll ``/health`` until it answers 200, or raise ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await self.health():
            if loop.time() > deadline:
                raise TimeoutError(f"inference server {self.base_url} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(interval_s)

    async def metrics(self) -> dict[str, float]:
        """``/metrics`` parsed: e.g. ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc``."""
        return engine_metrics(await self._request("GET", ENDPOINTS["metrics"]))

    async def init_weight_sync(self, request: WeightSyncInitRequest) -> None:
        """Make the server join the weight-sync group (returns once the whole group formed)."""
        try:
            await self._request("POST", ENDPOINTS["weights_init"], json=request.model_dump())
        except InferenceServerError as exc:
            if exc.status != 404:
                raise
            raise WeightSyncError(
                f"inference server {self.base_url} has no {ENDPOINTS['weights_init']} (HTTP 404): it is not a "
                "transformers-engine server. A vllm-engine server takes weight syncs through its worker "
                "extension: create its client with engine.client(url) (a VllmClient)"
            ) from exc

    async def update_weights(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        """Make the server receive and load the next sync (run concurrently with the trainer's send).

        The transformers engine swaps between decode steps by itself (``VllmClient`` pauses vLLM
        around the swap). With ``apply=False`` the server takes part in the broadcast and verifies
        it but keeps its weights and weight version (``applied`` is false in the answer).
        """
        if apply:
            self._newest_version = max(version, self._newest_version or 0)
        raw = await self._request(
            "POST", ENDPOINTS["weights_update"], json={"version": version, "apply": apply}
        )
        return self._confirmed(WeightUpdateResponse.model_validate(raw))

    def _confirmed(self, response: WeightUpdateResponse) -> WeightUpdateResponse:
        """Remember the version the server says it now serves (the floor of later completions)."""
        if response.applied:
            self.served_version = response.version
        return response

    async def weight_version(self) -> int:
        """The weight version the server serves."""
        return int((await self._request("GET", ENDPOINTS["weights_version"]))["weight_version"])


def _completion(choice: Any, response_id: str | None = None) -> Completion:
    if choice.token_ids is None:
        raise InferenceServerError(
            200, "completion choice has no token_ids (the server ignored return_token_ids)"
        )
    logprobs = [
        float(x) if x is not None else float("nan")
        for x in (choice.logprobs.token_logprobs if choice.logprobs else [])
    ]
    if len(logprobs) != len(choice.token_ids):
        raise InferenceServerError(
            200, f"choice {choice.index}: {len(choice.token_ids)} tokens but {len(logprobs)} logprobs"
        )
    return Completion(
        index=choice.index,
        token_ids=list(choice.token_ids),
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
        text=choice.text,
        prompt_token_ids=choice.prompt_token_ids,
        weight_versions=choice.weight_versions,
        response_id=response_id,
        top_logprobs=_top_ids(choice.logprobs.top_logprobs if choice.logprobs else None),
        prompt_logprobs=prompt_logprob_ids(choice.prompt_logprobs),
    )


def prompt_logprob_ids(
    raw: list[dict[str, dict[str, Any]] | None] | None,
) -> list[dict[int, float] | None] | None:
    """vLLM's ``prompt_logprobs`` (``{"<id>": {"logprob": ...}}`` per position) keyed by token id."""
    if raw is None:
        return None
    return [None if row is None else {int(k): float(v["logprob"]) for k, v in row.items()} for row in raw]


def _top_ids(top: list[dict[str, float] | None] | None) -> list[dict[int, float]] | None:
    """``top_logprobs`` keyed ``token_id:<id>`` -> keyed by id (None unless every key names an id)."""
    if not top:
        return None
    out: list[dict[int, float]] = []
    for alternatives in top:
        row: dict[int, float] = {}
        for key, value in (alternatives or {}).items():
            if not key.startswith("token_id:"):
                return None
            row[int(key.removeprefix("token_id:"))] = float(value)
        out.append(row)
    return out


def _error_from(status: int, body: Any) -> Exception:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message", error))
        if error.get("type") == "WeightSyncMismatchError":
            return WeightSyncMismatchError(
                str(error.get("where", "server")), list(error.get("tensors", [])), message
            )
        if error.get("type") == "WeightSyncError":
            return WeightSyncError(message)
        if "weight sync verification failed" in message:  # raised inside a vLLM worker
            return WeightSyncMismatchError("server", [], message)
        return InferenceServerError(status, message)
    if isinstance(body, dict) and "weight sync verification failed" in str(body.get("message", "")):
        return WeightSyncMismatchError("server", [], str(body["message"]))
    return InferenceServerError(
        status, str(body if not isinstance(body, dict) else body.get("message", body))
    )
