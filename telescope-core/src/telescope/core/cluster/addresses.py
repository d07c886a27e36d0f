"""Which address one process uses to reach another on a (possibly multi-node) Ray cluster.

Loopback only when both ends share a node; otherwise the other node's address as Ray reports
it. A server bound to loopback on another node cannot be reached at all: that is an error
naming ``inference_host``. No Ray import: callers pass the node addresses.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "DRIVER_ADDRESS_ENV",
    "LOOPBACK",
    "driver_host_from",
    "is_loopback",
    "reach_host",
    "reachable_url",
]

LOOPBACK = "127.0.0.1"
#: Set on inference server actors: the driver node's address (where the OTLP receiver listens).
DRIVER_ADDRESS_ENV = "TELESCOPE_DRIVER_ADDRESS"


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine only: ``localhost`` or a loopback address (127.0.0.0/8, ::1).

    A server bound there cannot be reached from another node, nor by anyone else on the network
    (why ``telescope ui`` warns about any other bind). A host name that merely starts with
    ``127.`` is a name, not a loopback address.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reach_host(target_node_ip: str, here_node_ip: str) -> str:
    """Host to reach something listening on ``target_node_ip``'s node from ``here_node_ip``'s node."""
    return LOOPBACK if target_node_ip == here_node_ip else target_node_ip


def reachable_url(
    local_url: str, server_node_ip: str, client_node_ip: str, *, bound_host: str, what: str = "server"
) -> str:
    """``local_url`` (how the server's own node reaches it) as seen from ``client_node_ip``'s node.

    A wildcard-bound server (``bound_host`` 0.0.0.0) reports a loopback URL: on another node it
    is reached at its node's address instead. A server bound to loopback on another node is
    unreachable: ValueError.
    """
    if server_node_ip == client_node_ip:
        return local_url
    parts = urlsplit(local_url)
    if not is_loopback(parts.hostname or ""):
        return local_url
    if is_loopback(bound_host):
        bound = bound_host
        raise ValueError(
            f"{what} {local_url} runs on node {server_node_ip} but listens on loopback only "
            f"(inference_host: {bound}), so the driver on node {client_node_ip} cannot reach it; set "
            "inference_host: 0.0.0.0 (or that node's address) on a multi-node cluster"
        )
    netloc = f"{server_node_ip}:{parts.port}" if parts.port else server_node_ip
    return urlunsplit(parts._replace(netloc=netloc))


def driver_host_from(here_node_ip: str) -> str:
    """Host for reaching the driver's node from this process (``DRIVER_ADDRESS_ENV``; loopback if unset)."""
    driver = os.environ.get(DRIVER_ADDRESS_ENV, "")
    return reach_host(driver, here_node_ip) if driver else LOOPBACK
