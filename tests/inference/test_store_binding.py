"""The rendezvous and weight-sync stores listen only on the address they are given (PyTorch's own
TCPStore server binds every interface, whatever host it is handed)."""

from __future__ import annotations

import datetime
import socket

import pytest

pytest.importorskip("torch")

from telescope.core.weights.store import bound_tcp_store


def listening_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port`` (``/proc/net/tcp`` and ``tcp6``: state 0A)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port and len(address) == width:
                found.add(address)
    return found


def test_the_store_listens_on_loopback_only_and_serves_a_peer() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeout = datetime.timedelta(seconds=10)
    server = bound_tcp_store("127.0.0.1", port, 2, True, timeout)
    client = bound_tcp_store("127.0.0.1", port, 2, False, timeout)
    client.set("weights", "v1")
    assert server.get("weights") == b"v1"
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing on 0.0.0.0 or ::


def test_torch_own_store_would_listen_everywhere() -> None:
    """Why bound_tcp_store exists: if this starts failing, PyTorch honours the host and it can go."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    assert listening_addresses(store.port) - {"0100007F"}, listening_addresses(store.port)
