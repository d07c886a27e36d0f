"""A restarted inference server waits for the port of the one it replaces to close (``wait_port_free``):
a SIGKILLed vLLM server's processes take seconds to exit, and the restart found its port still in
use (a frozen vLLM server's restart failed the run with "port ... is already in use")."""

from __future__ import annotations

import socket
import threading

import pytest

from telescope.core.inference.launcher import wait_port_free


def test_the_wait_returns_once_the_port_closes_and_names_it_when_it_never_does() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(RuntimeError, match=f"port {listener.getsockname()[1]} .* is already in use"):
        wait_port_free(url, timeout_s=0.3, interval_s=0.05)
    closer = threading.Timer(0.3, listener.close)  # the killed server's process exiting
    closer.start()
    wait_port_free(url, timeout_s=10, interval_s=0.05)  # returns: the port closed meanwhile
    closer.join()
