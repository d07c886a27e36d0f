"""Tries one TCP port at every address this network namespace can see; prints a JSON report.

Run as ``python3 loopback_probe.py PORT [ADDRESS...]`` inside a run's network namespace or a
sandbox (standard library only: a sandbox has the host's python3, not the venv). The addresses
tried: this namespace's own (IPv4, IPv6 and their IPv4-mapped forms), its gateways, the
``ADDRESS`` arguments (the host's addresses as the host sees them), loopback, and the user-mode
networks' well-known host aliases (slirp4netns's 10.0.2.2, pasta's 192.0.2.1). The report maps
each address to ``connected`` or the error; ``reached`` lists those that connected, ``gateways``
the namespace's gateways.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import threading
from pathlib import Path

WELL_KNOWN = ["127.0.0.1", "::1", "::ffff:127.0.0.1", "10.0.2.2", "10.0.2.3", "192.0.2.1", "fe80::1"]


def _read(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _ipv4_from_hex(little_endian: str) -> str:
    return str(ipaddress.IPv4Address(bytes.fromhex(little_endian)[::-1]))


def _ipv6_from_hex(value: str) -> str:
    return str(ipaddress.IPv6Address(bytes.fromhex(value)))


def gateways() -> dict[str, int]:
    """This namespace's gateways (IPv4 and IPv6), each with its interface index (for a link-local
    IPv6 gateway; 0 otherwise)."""
    found: dict[str, int] = {}
    for line in _read("/proc/net/route")[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[2] != "00000000":
            found[_ipv4_from_hex(fields[2])] = 0
    indexes = {name: index for index, name in socket.if_nameindex()}
    for line in _read("/proc/net/ipv6_route"):
        fields = line.split()
        if len(fields) > 9 and fields[4] != "0" * 32:
            found[_ipv6_from_hex(fields[4])] = indexes.get(fields[9], 0)
    return found


def seen_addresses() -> dict[str, int]:
    """Every address of this namespace and its gateways, with interface indexes as ``gateways``."""
    found = gateways()
    lines = _read("/proc/net/fib_trie")
    for i, line in enumerate(lines[1:], 1):
        if "/32 host LOCAL" in line:
            found[lines[i - 1].split()[-1]] = 0
    for line in _read("/proc/net/if_inet6"):
        fields = line.split()
        found[_ipv6_from_hex(fields[0])] = int(fields[1], 16)
    return found


def targets(extra: list[str]) -> dict[str, int]:
    """What to try: the seen addresses, ``extra``, the well-known ones and IPv4-mapped forms."""
    found = {**seen_addresses(), **dict.fromkeys(extra, 0)}
    for address in WELL_KNOWN:
        found.setdefault(address, 0)
    for address in list(found):
        if ipaddress.ip_address(address).version == 4:
            found.setdefault(f"::ffff:{address}", 0)
    return found


def attempt(address: str, scope: int, port: int, report: dict[str, str]) -> None:
    version = ipaddress.ip_address(address).version
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    where = (address, port, 0, scope) if version == 6 else (address, port)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(where)
            sock.sendall(b"probe\n")
        report[address] = "connected"
    except OSError as exc:
        report[address] = f"{type(exc).__name__}: {exc}"


class LoopbackListener:
    """On the host: one port on 127.0.0.1 and ::1 only (a database, a notebook, another run's
    servers), recording every connection it accepts until ``close``."""

    def __init__(self) -> None:
        self.sockets = [socket.create_server(("127.0.0.1", 0))]
        self.port = self.sockets[0].getsockname()[1]
        try:
            self.sockets.append(socket.create_server(("::1", self.port), family=socket.AF_INET6))
        except OSError:
            pass  # no IPv6 on this host: nothing to reach there
        self.accepted: list[object] = []
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in self.sockets]
        for thread in self._threads:
            thread.start()

    def _accept(self, server: socket.socket) -> None:
        server.settimeout(0.1)
        while server.fileno() >= 0:
            try:
                connection, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(peer)
            connection.close()

    def close(self) -> list[object]:
        """Stop listening; the peers that connected."""
        for server in self.sockets:
            server.close()
        for thread in self._threads:
            thread.join(timeout=2)
        return self.accepted


def main() -> None:
    port, extra = int(sys.argv[1]), sys.argv[2:]
    report: dict[str, str] = {}
    threads = [
        threading.Thread(target=attempt, args=(address, scope, port, report))
        for address, scope in targets(extra).items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reached = sorted(a for a, outcome in report.items() if outcome == "connected")
    print(json.dumps({"tried": report, "reached": reached, "gateways": sorted(gateways())}))


if __name__ == "__main__":
    main()
