"""Self-healing inference: a server that dies is restarted, re-synced and given its work back.

The inference supervisor (``servers.py``) notices a dead server when a request fails and ``/health`` does
not answer, or before a weight sync (every server is checked first: a broadcast to a dead
member would fail every receiver), and a frozen one when its samples go unanswered far longer
than the recent ones took and ``/health`` does not answer (``server_watch.py``). It then,
holding the sync lock:

1. SIGKILLs the server's process group (a frozen process cannot exit when asked; a dead one is
   only reaped) and drains it: its queued and running groups are cancelled and their prompts
   re-queued with the same group ids (nothing lost, nothing trained twice);
2. restarts the server process (``InferenceServerWorker.restart``, same port) and re-forms
   the weight-sync group with every server and trainer rank 0;
3. syncs the current weights to every server, verified by fingerprint (when the trainer is
   already ahead, the sync that follows does it), then gives the server work again.

Each server is restarted at most ``inference_max_restarts`` times; past that it is dropped
(the group re-formed without it) while other servers remain, else the run fails with the
server's last log line. A server that *freezes* during a broadcast is killed once the broadcast
has waited ``inference_overdue_floor_s`` with its ``/health`` silent, restarted, and the broadcast
done again (``InferenceSupervisor._broadcast``). A server dying during a broadcast is not healed:
the broadcast fails (or times out after ``ray_broadcast_init_timeout_s``) and ends the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.inference.server_client import ServerClient

__all__ = ["RayServerHealer", "ServerRestartsExhaustedError"]

HEALTH_TIMEOUT_S = 10.0
"""A ``/health`` that takes longer than this counts as not answering (the client's own timeout is an hour)."""


class ServerRestartsExhaustedError(RuntimeError):
    """A server died more often than ``inference_max_restarts`` allows."""


class RayServerHealer:
    """What the orchestrator needs to restart a server: its Ray actor, its client, the group re-forming.

    ``reform_sync_group(clients)`` forms a new weight-sync group of trainer rank 0 and those
    servers; ``excluded`` (shared with ``RayTrainerGroup``) holds the servers dropped for good.
    """

    def __init__(
        self,
        actors: list[Any],
        clients: list[ServerClient],
        reform_sync_group: Callable[[list[ServerClient]], Awaitable[None]],
        excluded: set[int],
    ) -> None:
        self.actors = actors
        self.clients = clients
        self.reform_sync_group = reform_sync_group
        self.excluded = excluded

    async def _reform(self) -> None:
        await self.reform_sync_group([c for i, c in enumerate(self.clients) if i not in self.excluded])

    async def healthy(self, server: int) -> bool:
        """``/health`` answers (asked twice, a second apart: one slow answer is no reason to restart)."""
        for attempt in range(2):
            try:
                if await asyncio.wait_for(self.clients[server].health(), timeout=HEALTH_TIMEOUT_S):
                    return True
            except TimeoutError:
                pass  # a server that stopped answering counts as dead
            if attempt == 0:
                await asyncio.sleep(1.0)
        return False

    async def where(self, server: int) -> str:
        """``pid 4321 on node 10.0.0.5, http://10.0.0.5:8100``: where the server process runs."""
        try:
            return str(await asyncio.wait_for(self.actors[server].where.remote(), timeout=HEALTH_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - only a hint for the diagnosis
            return f"its process not known: {type(exc).__name__}: {exc}"

    async def running(self, server: int) -> bool:
        """Whether the server's process still exists: silent and running is frozen or hung, not dead."""
        try:
            return bool(
                await asyncio.wait_for(self.actors[server].server_running.remote(), timeout=HEALTH_TIMEOUT_S)
            )
        except Exception:  # noqa: BLE001 - an actor that cannot say is treated as holding a dead server
            return False

    async def log_tail(self, server: int) -> str:
        try:
            return str(await self.actors[server].log_tail.remote())
        except Exception as exc:  # noqa: BLE001 - only a hint for the warning
            return f"(log not readable: {exc})"

    async def restart(self, server: int) -> None:
        """Start the server process again and re-form the weight-sync group (all members)."""
        await self.actors[server].restart.remote()
        await self._reform()

    async def drop(self, server: int) -> None:
        """Leave ``server`` out of the run: the sync group is re-formed without it."""
        self.excluded.add(server)
        try:
            await self.actors[server].stop.remote()
        except Exception:  # noqa: BLE001 - it is dead already; stopping only reaps it
            pass
        await self._reform()

    async def kill(self, server: int) -> None:
        """SIGKILL the server's process group (a frozen server before its restart; fault injection)."""
        await self.actors[server].kill_server.remote()
