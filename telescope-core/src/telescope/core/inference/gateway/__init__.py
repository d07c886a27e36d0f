"""The gateway: the one OpenAI-compatible API in front of every engine (agents, eval scripts, ``telescope serve``).

- ``app``: ``Gateway`` (the aiohttp routes) and ``GatewaySettings``.
- ``schema``: request bodies; ``chat``: rendering and tool-call parsing; ``stream``: SSE chunks.
- ``capture``: per-rollout keys, the calls they made in token ids, and trajectories from them.
- ``serve``: start a gateway (in a thread or on an event loop) over an engine's client.

Importing this package imports nothing heavy (``app`` needs aiohttp).
"""

from __future__ import annotations
