"""Where each request of a rollout goes: a routing policy between the lanes and the servers.

The lanes bound how many rollouts each server takes and place a group on the server with the
most free slots (its ``home``); the router decides, request by request, which server answers.
A rollout's next turn extends its conversation and a group's samples share their prompt, so the
server that answered the previous request holds that prefix in its cache (vLLM's prefix cache).

Policies (``routing_policy``):

- ``pinned``: every request to the group's home (Telescope before routing existed);
- ``sticky``: a group's requests go where a hash of the group sends them, whatever the load
  (a consistent hash: the affinity of prime-rl's ``consistent_hash``);
- ``least_loaded``: every request to the server with the fewest requests in flight;
- ``sticky_least_loaded``: a request goes to the server holding its prefix (its rollout's
  conversation; a rollout's first request: the least loaded of the servers holding its group's
  prompt, at first the home). A later turn leaves that server, for the least loaded, only when the
  server is saturated (it runs more than ``routing_saturation_margin`` requests beyond the least
  loaded one) and, where its prefix cache size is known (``cache_tokens``, per server: a run reads
  it from each vLLM server's ``cache_config_info``), the conversations it holds no longer fit in
  that cache: a move re-prefills the whole conversation,
  which is worth it only once the cache is overfull (the conversation is likely evicted already,
  and moving it frees room for the others), not for a queue a few requests long. The routing bench
  traced it: on long prompts each load-only move forfeited ~3,500 cached tokens (85% of its
  conversation) and bought no hit back; on agentic rollouts the moves that paid were those off
  servers whose conversations overflowed the cache. A rollout's first request is not moved for
  load (only off a server that is unavailable): the lanes already start each group on the server
  with the most free slots, and moving a group's first requests scatters its shared prompt to
  servers where nothing of it is cached yet (long prompts lost 2.5 points of hit rate that way).

Load is the requests in flight per server (``request`` counts them); the conversation tokens a
server holds are each held rollout's last prompt (``route``'s ``prompt_tokens``); a finished
rollout releases its affinity (``release``), and a group's once its last rollout has. Requests
sent to the server holding their prefix are counted in ``sticky``, those sent away in ``moves``
(``take_counts``: a step's).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["ROUTING_POLICIES", "RouteKey", "Router", "RoutingPolicy"]

RoutingPolicy = Literal["pinned", "sticky", "least_loaded", "sticky_least_loaded"]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)


@dataclass(frozen=True)
class RouteKey:
    """What the router knows of one request: whose prefix it extends, and where the lanes put it."""

    rollout: str
    """The rollout (its next turn extends its own conversation)."""
    group: str
    """The group (its samples share the prompt)."""
    home: int
    """The server the lanes placed the group on (holds the rollout's lane slot)."""


@dataclass
class _GroupAffinity:
    servers: set[int]
    """The servers that got a request of the group (each holds its prompt)."""
    rollouts: int = 0
    """Rollouts of the group that have not finished (the affinity is released at 0)."""


class Router:
    """Routes requests by ``policy``; counts requests in flight and the moves it made."""

    def __init__(
        self,
        num_servers: int,
        policy: str = "sticky_least_loaded",
        saturation_margin: int = 8,
        available: Callable[[int], bool] | None = None,
        cache_tokens: int | Sequence[int | None] | None = None,
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy {policy!r} is not one of {', '.join(ROUTING_POLICIES)}")
        if num_servers < 1:
            raise ValueError(f"a router needs at least one server, got {num_servers}")
        caches = _per_server(cache_tokens, num_servers)
        self.policy = policy
        self.saturation_margin = saturation_margin
        self.running = [0] * num_servers
        """Requests in flight per server."""
        self.cache_tokens = caches
        """Each server's prefix cache in tokens (None: not known, a saturated server alone moves a turn)."""
        self.moves = 0
        """Requests sent away from the server holding their prefix (saturated, or unavailable)."""
        self.sticky = 0
        """Requests sent to the server holding their prefix (a later turn: its conversation; a first: its
        group's prompt); ``sticky`` and ``sticky_least_loaded`` only."""
        self._counted = (0, 0)
        """``moves`` and ``sticky`` at the previous ``take_counts``."""
        self._available = available or (lambda _server: True)
        self._held = [0] * num_servers
        """Conversations each server holds (rollouts routed there that have not finished)."""
        self._held_tokens = [0] * num_servers
        """Tokens of the conversations each server holds (each held rollout's last prompt)."""
        self._rollouts: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._groups: dict[str, _GroupAffinity] = {}

    @property
    def num_servers(self) -> int:
        return len(self.running)

    def sessions(self, server: int) -> int:
        """Rollouts whose conversation ``server`` holds."""
        return self._held[server]

    def held_tokens(self, server: int) -> int:
        """Tokens of the conversations ``server`` holds (each held rollout's last prompt)."""
        return self._held_tokens[server]

    def route(self, key: RouteKey, prompt_tokens: int = 0) -> int:
        """The server for the next request of ``key``'s rollout, whose prompt is ``prompt_tokens`` long
        (that server holds the conversation from now on)."""
        if self.policy == "pinned":
            return key.home
        if self.policy == "least_loaded":
            return self._least_loaded()
        held = self._rollouts.get(key.rollout)
        group = self._groups.get(key.group)
        later_turn = held is not None
        if held is None:  # a rollout's first request: a server holding its group's prompt
            if group is None:
                first = self._hash(key.group) if self.policy == "sticky" else key.home
                group = self._groups[key.group] = _GroupAffinity({first})
            group.rollouts += 1
            held = min(group.servers, key=lambda i: (self.running[i], i))
        server = held
        balance = self.policy == "sticky_least_loaded" and later_turn
        if not self._available(held) or (balance and self._saturated(held) and self._overfull(held)):
            server = self._least_loaded()
        if server == held:
            self.sticky += 1
        else:
            self.moves += 1
        if group is not None:
            group.servers.add(server)
        self._hold(key.rollout, server, prompt_tokens)
        return server

    def take_counts(self) -> tuple[int, int]:
        """``(moves, sticky)`` since the previous call (a step's requests); counting starts again."""
        moves, sticky = self.moves - self._counted[0], self.sticky - self._counted[1]
        self._counted = (self.moves, self.sticky)
        return moves, sticky

    def release(self, key: RouteKey) -> None:
        """``key``'s rollout finished: it holds no server, and its group none once all its rollouts finished."""
        server = self._rollouts.pop(key.rollout, None)
        if server is None:
            return
        self._held[server] -= 1
        self._held_tokens[server] -= self._tokens.pop(key.rollout, 0)
        group = self._groups.get(key.group)
        if group is not None:
            group.rollouts -= 1
            if group.rollouts <= 0:
                del self._groups[key.group]

    @contextmanager
    def request(self, server: int) -> Iterator[None]:
        """Count one request in flight on ``server`` while the block runs."""
        self.running[server] += 1
        try:
            yield
        finally:
            self.running[server] -= 1

    def _hold(self, rollout: str, server: int, tokens: int) -> None:
        previous = self._rollouts.get(rollout)
        if previous is not None:
            self._held[previous] -= 1
            self._held_tokens[previous] -= self._tokens[rollout]
        self._rollouts[rollout] = server
        self._tokens[rollout] = tokens
        self._held[server] += 1
        self._held_tokens[server] += tokens

    def _overfull(self, server: int) -> bool:
        """The conversations ``server`` holds no longer fit its prefix cache (True when its size is unknown)."""
        cache = self.cache_tokens[server]
        return cache is None or self._held_tokens[server] > cache

    def _saturated(self, server: int) -> bool:
        least = min((self.running[i] for i in self._candidates()), default=self.running[server])
        return self.running[server] - least > self.saturation_margin

    def _candidates(self) -> list[int]:
        return [i for i in range(self.num_servers) if self._available(i)]

    def _least_loaded(self) -> int:
        """Fewest requests in flight; ties go to the server holding the fewest conversations."""
        candidates = self._candidates() or list(range(self.num_servers))
        return min(candidates, key=lambda i: (self.running[i], self._held[i], i))

    def _hash(self, group: str) -> int:
        return zlib.crc32(group.encode()) % self.num_servers


def _per_server(cache_tokens: int | Sequence[int | None] | None, num_servers: int) -> list[int | None]:
    """``cache_tokens`` as one size (or None) per server; a size that is not positive is refused."""
    sizes = list(cache_tokens) if isinstance(cache_tokens, Sequence) else [cache_tokens] * num_servers
    if len(sizes) != num_servers:
        raise ValueError(
            f"cache_tokens has {len(sizes)} sizes for {num_servers} servers; pass one per server (None where "
            "a server's prefix cache size is not known) or a single size for all"
        )
    for server, size in enumerate(sizes):
        if size is not None and size < 1:
            raise ValueError(
                f"cache_tokens (each server's prefix cache, in tokens) must be positive, got {size}; pass None "
                f"when server {server}'s is not known"
            )
    return sizes
