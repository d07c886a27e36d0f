"""Server processes exit when the process that launched them dies (no orphaned servers).

Servers run in their own session so a stop can kill their whole process group; the price is
that a parent killed with SIGKILL (a crashed Ray actor, ``kill -9`` of the run) would leave them
running. A daemon thread notices the re-parenting and ends the process.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["exit_with_parent"]


def exit_with_parent(interval_s: float = 1.0) -> threading.Thread:
    """Start the watcher; ``os._exit(0)`` as soon as the parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(0)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
