"""SIGTERM stops a run the way Ctrl-C does.

Schedulers, ``timeout`` and ``docker stop`` send SIGTERM. Python's default ends the process
at once, and ``ray.init`` installs a handler that calls ``sys.exit`` from whatever frame
runs (inside the event loop, mid-teardown): the run directory stays ``running`` and actors
are left behind. Routed to the SIGINT handler instead, SIGTERM takes the path Ctrl-C
takes: inside ``asyncio.run`` the main task is cancelled (the orchestrator shuts down its
groups), then ``KeyboardInterrupt`` reaches the driver, which stops every process and
marks the run ``interrupted``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["route_sigterm_to_interrupt", "sigterm_as_interrupt", "teardown_signals"]

log = logging.getLogger("telescope.runtime")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    log.warning(
        "received SIGTERM: stopping the run as on Ctrl-C (the run can be resumed from its checkpoints)"
    )
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # asyncio.run's handler cancels its main task; the default raises
        return
    raise KeyboardInterrupt


def route_sigterm_to_interrupt() -> None:
    """Install the SIGTERM handler (again after ``ray.init``, which replaces it); main thread only."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves as SIGINT inside the block; the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: Any = signal.getsignal(signal.SIGTERM)
    route_sigterm_to_interrupt()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _while_stopping(signum: int, frame: FrameType | None) -> None:
    log.warning(
        "received %s while stopping: the processes are being stopped, please wait",
        signal.Signals(signum).name,
    )


@contextlib.contextmanager
def teardown_signals() -> Iterator[None]:
    """Keep a second Ctrl-C / SIGTERM from cutting the teardown short (it would leave actors behind).

    Teardown is bounded (server stops time out after 30 s), so waiting for it is safe.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _while_stopping)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
