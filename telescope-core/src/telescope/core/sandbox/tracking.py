"""Process-wide record of live sandboxes, destroyed at interpreter exit and on SIGINT/SIGTERM.

Every sandbox a ``SandboxProvider`` creates is recorded here until it is destroyed, so a
crash, Ctrl-C or a ``kill`` of the driver does not leak cloud sandboxes (which cost money)
or local sandbox processes. This is the one piece of process-global state in the sandbox
API: exit and signal handlers are process-global by nature.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from telescope.core.sandbox.types import SandboxHandle

__all__ = ["cleanup_all", "install_exit_handlers", "live_sandboxes"]

_log = logging.getLogger(__name__)


class Destroyer(Protocol):
    """What the exit handlers need of a provider (``SandboxProvider`` is one): a blocking destroy."""

    def destroy_sync(self, handle: SandboxHandle) -> None: ...


_lock = threading.RLock()
_live: dict[int, tuple[Destroyer, SandboxHandle]] = {}
_previous_handlers: dict[int, Any] = {}
_atexit_installed = False
_handling: set[int] = set()


def track(provider: Destroyer, handle: SandboxHandle) -> None:
    """Record a newly created sandbox (and make sure the exit handlers are installed)."""
    with _lock:
        _live[id(handle)] = (provider, handle)
    install_exit_handlers()


def untrack(handle: SandboxHandle) -> bool:
    """Forget a sandbox; returns False when it was not recorded (already destroyed)."""
    with _lock:
        return _live.pop(id(handle), None) is not None


def live_sandboxes() -> list[SandboxHandle]:
    """Handles created and not yet destroyed in this process."""
    with _lock:
        return [h for _, h in _live.values()]


def cleanup_all() -> int:
    """Destroy every live sandbox synchronously; returns how many were destroyed.

    Failures are logged, not raised: this runs at exit and inside signal handlers.
    """
    with _lock:
        entries = list(_live.values())
        _live.clear()
    for provider, handle in entries:
        try:
            provider.destroy_sync(handle)
        except Exception:  # noqa: BLE001 - best effort at exit; the log names the sandbox
            _log.exception("could not destroy sandbox %s (%s) at exit", handle.id, handle.provider)
    return len(entries)


def _on_signal(signum: int, frame: Any) -> None:
    if signum in _handling:  # another handler chained back to us: do not loop
        return
    _handling.add(signum)
    try:
        _cleanup_then_chain(signum, frame)
    finally:
        _handling.discard(signum)


def _cleanup_then_chain(signum: int, frame: Any) -> None:
    count = cleanup_all()
    if count:
        _log.warning("signal %d: destroyed %d live sandbox(es)", signum, count)
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # Default action (terminate): restore it and re-deliver the signal to ourselves.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_exit_handlers() -> None:
    """Install the atexit hook and chain SIGINT/SIGTERM handlers (main thread only).

    The previous handlers still run after the cleanup, so Ctrl-C still raises
    ``KeyboardInterrupt`` and a framework's own SIGTERM handler is preserved.
    """
    global _atexit_installed
    with _lock:
        if not _atexit_installed:
            atexit.register(cleanup_all)
            _atexit_installed = True
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current is _on_signal:
                continue
            _previous_handlers[signum] = current
            signal.signal(signum, _on_signal)
