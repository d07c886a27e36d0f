"""``VllmClient``: the inference client of vllm-engine servers.

Completions, abort, pause and metrics are the shared protocol (``InferenceClient``); weight
syncs go through vLLM's dev-mode ``/collective_rpc`` to Telescope's worker extension
(``vllm_engine.worker``), one result per tensor-parallel worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from telescope.core.inference.client import InferenceClient, InferenceServerError
from telescope.core.inference.protocol import WeightSyncInitRequest, WeightUpdateResponse
from telescope.core.weights.errors import WeightSyncError, WeightSyncMismatchError
from telescope.core.weights.verify import compare_fingerprints

__all__ = ["VllmClient"]


class VllmClient(InferenceClient):
    """``InferenceClient`` whose weight-sync calls reach the worker extension through ``/collective_rpc``."""

    async def init_weight_sync(self, request: WeightSyncInitRequest) -> None:
        """Every TP worker joins the weight-sync group (returns once the whole group formed)."""
        await self._rpc("telescope_init_weight_sync", request.model_dump_json())

    async def update_weights(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        """Receive and load the next sync on every TP worker; vLLM is paused (``keep``: in-flight
        requests freeze, then continue with the new weights) around the worker-extension call."""
        start = asyncio.get_running_loop().time()
        if apply:
            self._newest_version = max(version, self._newest_version or 0)
        if not apply:  # nothing changes for in-flight requests: no pause
            results = await self._rpc("telescope_update_weights", str(version), apply=False)
        else:
            await self.pause("keep")
            try:
                results = await self._rpc("telescope_update_weights", str(version), apply=True)
            finally:
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
                fingerprints=first.get("fingerprints"),
            )
        )

    async def weight_version(self) -> int:
        """The weight version the server serves (worker 0's)."""
        return int((await self._rpc("telescope_weight_version"))[0])

    async def _rpc(self, method: str, *args: str, **kwargs: Any) -> list[Any]:
        """vLLM dev-mode ``POST /collective_rpc``: one result per worker (``kwargs`` must be JSON values)."""
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": kwargs, "timeout": None}
        raw = await self._request("POST", "/collective_rpc", json=body)
        results = raw.get("results") if isinstance(raw, dict) else None
        if not results:
            raise InferenceServerError(200, f"/collective_rpc {method} returned no worker results: {raw!r}")
        return list(results)


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
