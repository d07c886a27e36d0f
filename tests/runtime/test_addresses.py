"""Which address reaches a server, the driver or the trainer rendezvous (no cluster needed)."""

from __future__ import annotations

import pytest

from telescope.core.cluster.addresses import (
    DRIVER_ADDRESS_ENV,
    driver_host_from,
    is_loopback,
    reach_host,
    reachable_url,
)
from telescope.core.runtime.ray_group import rendezvous_host


@pytest.mark.parametrize(
    ("local", "server_node", "driver_node", "bound", "expected"),
    [
        # Same node: the server's own loopback URL is the fastest and always reachable.
        ("http://127.0.0.1:8100", "10.0.0.5", "10.0.0.5", "0.0.0.0", "http://127.0.0.1:8100"),
        # Wildcard bind on another node: that node's address.
        ("http://127.0.0.1:8100", "10.0.0.7", "10.0.0.5", "0.0.0.0", "http://10.0.0.7:8100"),
        # Bound to a specific address: that address, wherever the driver is.
        ("http://10.0.0.7:8100", "10.0.0.7", "10.0.0.5", "10.0.0.7", "http://10.0.0.7:8100"),
    ],
)
def test_reachable_url(local: str, server_node: str, driver_node: str, bound: str, expected: str) -> None:
    assert reachable_url(local, server_node, driver_node, bound_host=bound) == expected


def test_a_loopback_server_on_another_node_is_an_error_naming_inference_host() -> None:
    with pytest.raises(
        ValueError, match=r"listens on loopback only \(inference_host: 127.0.0.1\).*inference_host: 0.0.0.0"
    ):
        reachable_url("http://127.0.0.1:8100", "10.0.0.7", "10.0.0.5", bound_host="127.0.0.1")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        # What reachable_url is given: URL host names and inference_host.
        ("127.0.0.1", True),
        ("127.0.1.1", True),  # Debian's hostname entry
        ("::1", True),
        ("0:0:0:0:0:0:0:1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.7", False),
        ("", False),
        # What `telescope ui --host` is given: the same question (is this bind private to the machine).
        ("::", False),
        ("192.168.1.4", False),
        ("example.org", False),
        ("127.example.org", False),  # a host name, not an address: it may resolve anywhere
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_server_named_by_a_127_host_name_on_another_node_keeps_its_url() -> None:
    url = "http://127.example.org:8100"
    assert reachable_url(url, "10.0.0.7", "10.0.0.5", bound_host="0.0.0.0") == url


def test_driver_host_for_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DRIVER_ADDRESS_ENV, raising=False)
    assert driver_host_from("10.0.0.7") == "127.0.0.1"  # outside a run: the receiver is local
    monkeypatch.setenv(DRIVER_ADDRESS_ENV, "10.0.0.5")
    assert driver_host_from("10.0.0.7") == "10.0.0.5" and driver_host_from("10.0.0.5") == "127.0.0.1"
    assert reach_host("10.0.0.5", "10.0.0.5") == "127.0.0.1"


def test_rendezvous_is_loopback_only_when_every_rank_shares_rank_0s_node() -> None:
    assert rendezvous_host(["10.0.0.5", "10.0.0.5"]) == "127.0.0.1"
    # Rank 0 on the driver's node, rank 1 elsewhere: rank 1 must dial rank 0's address.
    assert rendezvous_host(["10.0.0.5", "10.0.0.7"]) == "10.0.0.5"
