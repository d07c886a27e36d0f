"""``VllmClient``: the inference client of vllm-engine servers.

Completions, pause and metrics are the shared protocol (``InferenceClient``); weight syncs go
through ``/telescope/collective_rpc`` (served by ``vllm_engine.guard``, no dev mode) to Telescope's worker extension
(``vllm_engine.worker``), one result per tensor-parallel worker. What differs from the
transformers engine, each checked against vLLM's source by the contract tests
(tests/inference/test_vllm_contract.py):

- **Abort** is by disconnect. vLLM names a completion ``cmpl-<request_id>-<prompt index>``, and its
  ``/abort_requests`` route exists only under ``--tokens-only``; but every completion route aborts
  its request when the client disconnects. ``abort(ids)`` closes the connection of each matching
  request in flight (a multi-turn sample's turns are ``<id>-t<turn>``) and counts those, and also
  those its caller's cancellation closed before (the run cancels a stale group's tasks first, then
  aborts their ids: by then their connections are closed, and vLLM has aborted them).
- **Pause** around a sync is ``mode=keep`` with ``clear_cache`` explicit (``pause_clear_cache``).
- **Prefix cache**: each request carries a ``cache_salt`` that changes at every applied sync, so a
  request never reuses KV blocks computed with older weights.
- **Seeds** are sent only with ``per_request_seed`` (vLLM samples seeded requests one by one).
- **LoRA** (``lora_name``): after the worker extension wrote a sync's adapter, the guard reloads it in
  place under ``lora_name`` (``POST /telescope/lora/load``), still paused; from the first such load
  on, every request names the adapter as its ``model`` (vLLM's OpenAI server picks the LoRA by
  name). Before it, requests go to the base model: the trainer's adapters start with ``lora_B = 0``,
  so base and adapter give the same tokens and logprobs until the first sync.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from typing import Any

from telescope.core.inference.client import Completion, InferenceClient, InferenceServerError
from telescope.core.inference.protocol import ENDPOINTS, WeightSyncInitRequest, WeightUpdateResponse
from telescope.core.inference.vllm_engine.guard import LORA_LOAD_PATH, RPC_PATH
from telescope.core.weights.errors import WeightSyncError, WeightSyncMismatchError
from telescope.core.weights.verify import compare_fingerprints

__all__ = ["VllmClient", "matches_request"]

#: Cancelled requests remembered for a later ``abort`` to count (a run aborts them at once).
MAX_CLOSED_REMEMBERED = 4096


def matches_request(request_id: str, sent_id: str) -> bool:
    """Whether ``sent_id`` (an id a completion was sent with) belongs to the sample ``request_id``:
    the id itself, or one of its multi-turn requests ``<request_id>-t<turn>``."""
    return sent_id == request_id or re.fullmatch(re.escape(request_id) + r"-t\d+", sent_id) is not None


class VllmClient(InferenceClient):
    """``InferenceClient`` for ``vllm serve``: weight syncs through ``/telescope/collective_rpc``, abort by disconnect."""

    def __init__(
        self,
        base_url: str,
        *,
        pause_clear_cache: bool = False,
        per_request_seed: bool = False,
        lora_name: str | None = None,
        on_request: Callable[[str], None] | None = None,
        **options: Any,
    ) -> None:
        """``on_request(request_id)`` runs before each completion with an id is sent (the run's OTLP
        receiver keeps only the spans of ids it was told about: ``OtlpReceiver.expect``).
        ``lora_name``: the server serves the run's LoRA adapter under this name (``lora_rank > 0``)."""
        super().__init__(base_url, **options)
        self.pause_clear_cache = pause_clear_cache
        self.per_request_seed = per_request_seed
        self.on_request = on_request
        self.lora_name = lora_name
        self.lora_loaded = False
        """Whether the adapter was loaded (requests then name it as their ``model``)."""
        self._in_flight: dict[str, asyncio.Task[Any]] = {}
        """Request id -> the task awaiting its completion (cancelling it closes the connection)."""
        self._closed: dict[str, None] = {}
        """Ids of requests whose connection a cancellation closed before vLLM answered, which no
        ``abort`` has counted yet (oldest first, at most ``MAX_CLOSED_REMEMBERED``)."""
        # The prefix-cache namespace: new at every applied sync (and per client, so a restarted
        # client never meets the blocks of an earlier one).
        self._salt_base = uuid.uuid4().hex[:12]
        self._weights_epoch = 0

    @property
    def cache_salt(self) -> str:
        """The ``cache_salt`` of requests sent now: changes whenever the weights may have changed."""
        return f"telescope-{self._salt_base}-w{self._weights_epoch}"

    async def complete(self, prompt: list[int] | str, **params: Any) -> list[Completion]:
        """``/v1/completions`` with this client's ``cache_salt``; the seed only with ``per_request_seed``."""
        if not self.per_request_seed:
            params.pop("seed", None)
        params["cache_salt"] = self.cache_salt
        if self.lora_loaded:
            params["model"] = self.lora_name
        request_id = params.get("request_id")
        if request_id is not None and self.on_request is not None:
            self.on_request(str(request_id))
        task = asyncio.current_task()
        if request_id is None or task is None:
            return await super().complete(prompt, **params)
        self._in_flight[request_id] = task
        try:
            return await super().complete(prompt, **params)
        except asyncio.CancelledError:
            if self._in_flight.get(request_id) is task:  # not by ``abort``, which counted it already
                self._remember_closed(request_id)
            raise
        finally:
            if self._in_flight.get(request_id) is task:
                del self._in_flight[request_id]

    async def abort(self, request_ids: list[str] | None = None) -> int:
        """Close the connection of every matching request in flight (``None``: all); vLLM aborts a
        request whose client disconnected. Returns how many requests were closed unanswered: those
        in flight now, and those a cancellation closed since the last abort (counted once)."""

        def wanted(sent: str) -> bool:
            return request_ids is None or any(matches_request(r, sent) for r in request_ids)

        found = [sent for sent in self._in_flight if wanted(sent)]
        closed = [sent for sent in self._closed if wanted(sent)]
        for sent in closed:
            del self._closed[sent]
        current = asyncio.current_task()
        for sent in found:
            task = self._in_flight.pop(sent)
            if task is not current:
                task.cancel()
        await asyncio.sleep(0)  # let the cancelled tasks close their connections
        return len(found) + len(closed)

    def _remember_closed(self, request_id: str) -> None:
        self._closed[request_id] = None
        if len(self._closed) > MAX_CLOSED_REMEMBERED:  # ids nobody aborts (a shutdown's cancellations)
            del self._closed[next(iter(self._closed))]

    async def pause(self, mode: str = "keep") -> None:
        """``POST /pause?mode=...&clear_cache=...`` (vLLM >= 0.16); ``clear_cache`` from ``pause_clear_cache``."""
        params = {"mode": mode, "clear_cache": "true" if self.pause_clear_cache else "false"}
        await self._request("POST", ENDPOINTS["pause"], params=params)

    async def init_weight_sync(self, request: WeightSyncInitRequest) -> None:
        """Every TP worker joins the weight-sync group (returns once the whole group formed)."""
        await self._rpc("telescope_init_weight_sync", request.model_dump_json())

    async def update_weights(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        """Receive and load the next sync on every TP worker.

        vLLM's engine core runs a worker-extension call between two scheduler steps, never during a
        forward pass, so a full-weight load is already atomic for the running requests: they decode on
        with the new weights, keeping their KV. ``POST /pause?mode=keep`` (and ``/resume``) is sent only
        where it does something: with ``pause_clear_cache`` (vLLM then prefills the running requests
        again) and with LoRA, whose sync is two calls (write, then reload the adapter) that no step may
        fall between. Skipping it saves two HTTP round trips and vLLM's 20 ms settling sleep per sync
        (bench/vllm_sync.py).
        """
        start = asyncio.get_running_loop().time()
        if apply:
            self._newest_version = max(version, self._newest_version or 0)
        if not apply:  # nothing changes for in-flight requests
            results = await self._rpc("telescope_update_weights", str(version), apply="false")
        elif not self._sync_needs_pause:
            try:
                results = await self._rpc("telescope_update_weights", str(version), apply="true")
            finally:
                self._weights_epoch += 1  # also after a failed load: the weights may have changed part way
        else:
            await self.pause("keep")
            try:
                results = await self._rpc("telescope_update_weights", str(version), apply="true")
                if self.lora_name is not None:
                    await self._load_adapter(version, results)
            finally:
                # Also after a failed load: the weights may have changed part way.
                self._weights_epoch += 1
                await self.resume()
        first = results[0]
        _check_workers_agree(self.base_url, version, results)
        return self._confirmed(
            WeightUpdateResponse(
                version=first["version"],
                received_version=first.get("received_version", first["version"]),
                applied=bool(first.get("applied", True)),
                num_tensors=first["num_tensors"],
                seconds=asyncio.get_running_loop().time() - start,
                load_seconds=_slowest_load(results),
                reload=first.get("reload"),
                repacked_tensors=first.get("repacked_tensors"),
                fingerprints=first.get("fingerprints"),
            )
        )

    @property
    def _sync_needs_pause(self) -> bool:
        """Whether a sync pauses vLLM around its calls (``update_weights`` says when it must)."""
        return self.pause_clear_cache or self.lora_name is not None

    async def _load_adapter(self, version: int, results: list[Any]) -> None:
        """Reload the run's adapter from the folder worker 0 wrote for ``version`` (through the guard)."""
        path = results[0].get("adapter_path") if isinstance(results[0], dict) else None
        if not path:
            raise WeightSyncError(
                f"weight sync version {version} on {self.base_url}: the workers wrote no adapter (no "
                "adapter_path in their answer) although the client serves LoRA adapter "
                f"{self.lora_name!r}; the server's resolved config must have the run's lora_rank > 0"
            )
        await self._request("POST", LORA_LOAD_PATH, json={"lora_name": self.lora_name, "lora_path": path})
        self.lora_loaded = True

    async def weight_version(self) -> int:
        """The weight version the server serves (worker 0's)."""
        return int((await self._rpc("telescope_weight_version"))[0])

    async def _rpc(self, method: str, *args: str, **kwargs: str) -> list[Any]:
        """``POST /telescope/collective_rpc`` (served by ``vllm_engine.guard``): one result per worker.
        Only strings travel (``args: list[str]``, ``kwargs: dict[str, str]``); the worker extension parses
        them."""
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": kwargs, "timeout": None}
        raw = await self._request("POST", RPC_PATH, json=body)
        results = raw.get("results") if isinstance(raw, dict) else None
        if not results:
            raise InferenceServerError(200, f"{RPC_PATH} {method} returned no worker results: {raw!r}")
        return list(results)


def _slowest_load(results: list[Any]) -> float | None:
    """The slowest TP worker's load time (``timings.load`` of the worker extension), or None when a
    worker did not report one."""
    loads = [r.get("timings", {}).get("load") if isinstance(r, dict) else None for r in results]
    measured = [float(x) for x in loads if x is not None]
    return max(measured) if measured and len(measured) == len(loads) else None


def _check_workers_agree(url: str, version: int, results: list[Any]) -> None:
    """Every TP worker of a vLLM server received the same sync: same versions, same fingerprints.

    The orchestrator compares the first worker's fingerprints with the sender's (``check_sync``);
    this check extends that to the other workers, so a transfer gone wrong on any worker stops the run.
    """
    first = results[0]
    for i, other in enumerate(results[1:], start=1):
        where = f"version {version}, {url} TP worker {i} vs worker 0"
        for key in ("version", "received_version", "applied"):
            if other.get(key) != first.get(key):
                raise WeightSyncError(
                    f"weight sync {where}: {key} is {other.get(key)!r} on worker {i} but "
                    f"{first.get(key)!r} on worker 0; every TP worker must receive and load the same sync"
                )
        mine, theirs = first.get("fingerprints"), other.get("fingerprints")
        if (mine is None) != (theirs is None):
            raise WeightSyncMismatchError(
                where, sorted(mine or theirs or {}), "one worker returned no fingerprints"
            )
        if mine is not None:
            compare_fingerprints(mine, theirs, where=where)
