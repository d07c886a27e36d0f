"""Ports for end-to-end runs whose servers listen on ``inference_base_port + i``."""

from __future__ import annotations

import random
import socket

# Below Linux's ephemeral range (32768+) and above Ray's default worker ports (10002-19999), so
# neither the OS nor a Ray worker hands out a port of the block between picking it and binding it.
_LOW, _HIGH = 20000, 32000


def free_port_block(count: int) -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now."""
    for _ in range(200):
        base = random.randrange(_LOW, _HIGH - count)
        if all(_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no block of {count} free ports in [{_LOW}, {_HIGH})")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True
