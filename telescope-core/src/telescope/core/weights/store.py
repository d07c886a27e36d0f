"""A ``torch.distributed.TCPStore`` that listens only on the address it is given.

PyTorch's TCPStore server binds every interface whatever host it is handed (measured: ``*:PORT``
for ``TCPStore("127.0.0.1", ...)``), so the trainer rendezvous and the weight-sync stores were open
to the whole network even on a single machine. Here rank 0 binds the socket itself, on ``host``
only, and hands it to the store (``master_listen_fd``, libuv backend); the other ranks connect as
usual. A multi-node run gives the node's address, which is then the one address it listens on.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

__all__ = ["bound_tcp_store"]


def bound_tcp_store(
    host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta
) -> Any:
    """The store at ``host:port``: served by this process when ``is_master`` (bound to ``host`` only)."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(max(128, world_size))
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
            use_libuv=True,
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store serves (and closes) the socket from now on
    return store
