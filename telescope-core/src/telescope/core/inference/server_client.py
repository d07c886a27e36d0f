"""``ServerClient``: what a run needs from the client of one inference server.

The orchestrator, the rollout runner, evals, the healer and the weight sync talk to servers only
through these methods. ``client.InferenceClient`` (both engines' HTTP client) and
``vllm_engine.client.VllmClient`` implement it; tests use scripted fakes, fault injection a
wrapper (``inference/faults.py``). Importing this module imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from telescope.core.inference.client import Completion, InferenceClient
    from telescope.core.inference.protocol import WeightSyncInitRequest, WeightUpdateResponse

__all__ = ["ServerClient"]


class ServerClient(Protocol):
    """One inference server, as the run sees it."""

    async def complete(self, prompt: list[int] | str, **params: Any) -> list[Completion]:
        """``/v1/completions`` for one prompt; ``params`` are ``CompletionRequest`` fields."""
        ...

    async def abort(self, request_ids: list[str] | None = None) -> int:
        """Abort requests by id (``None`` = all); returns how many the server found."""
        ...

    async def health(self) -> bool:
        """True when the server answers ``/health``."""
        ...

    async def init_weight_sync(self, request: WeightSyncInitRequest) -> None:
        """Join the weight-sync group (returns once the whole group formed)."""
        ...

    async def update_weights(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        """Receive the next weight sync (``apply=False``: verify it, keep the current weights)."""
        ...

    async def close(self) -> None:
        """Release the connection."""
        ...


def _satisfies(client: InferenceClient) -> ServerClient:
    """mypy checks here that the HTTP client implements the protocol (never called)."""
    return client
