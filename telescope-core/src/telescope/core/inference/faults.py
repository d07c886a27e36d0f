"""The inference layer's fault seam: a client that fails or slows down requests on purpose.

Installed only when ``TELESCOPE_FAULTS`` is set (``runtime/supervision/faults.py`` for a run,
``evals/standalone.py`` for ``telescope eval``): ``request_fail``, ``server_slow`` and
``server_error`` (a 503, the infrastructure's) act on each completion request before it is sent. Unset, clients are used as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from telescope.core import faults, infra
from telescope.core.inference.client import InferenceServerError

if TYPE_CHECKING:
    from telescope.core.inference.client import Completion
    from telescope.core.inference.protocol import WeightSyncInitRequest, WeightUpdateResponse
    from telescope.core.inference.server_client import ServerClient

__all__ = ["FaultyClient", "with_request_faults"]


class FaultyClient:
    """A ``ServerClient`` whose completions first go through ``faults.on_request``."""

    def __init__(self, client: ServerClient) -> None:
        self.client = client

    async def complete(self, prompt: list[int] | str, **params: Any) -> list[Completion]:
        request_id = str(params.get("request_id", ""))
        await faults.on_request(request_id)
        spec = faults.current()
        if spec is not None and faults.draw("server_error", spec.server_error, request_id):
            error = InferenceServerError(503, f"TELESCOPE_FAULTS: server_error for request {request_id}")
            infra.mark(error, cause="server_error", provider="inference")  # as the client marks a real 503
            raise error
        return await self.client.complete(prompt, **params)

    async def abort(self, request_ids: list[str] | None = None) -> int:
        return await self.client.abort(request_ids)

    async def health(self) -> bool:
        return await self.client.health()

    async def init_weight_sync(self, request: WeightSyncInitRequest) -> None:
        await self.client.init_weight_sync(request)

    async def update_weights(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        return await self.client.update_weights(version, apply)

    async def close(self) -> None:
        await self.client.close()


def with_request_faults(clients: list[ServerClient]) -> list[ServerClient]:
    """``clients`` wrapped in ``FaultyClient`` when ``TELESCOPE_FAULTS`` is set, else ``clients``."""
    if faults.current() is None:
        return clients
    return [FaultyClient(client) for client in clients]
