"""The ``debug`` config field: DEBUG logging of every ``telescope.*`` logger, in each process.

The driver calls it when the run starts and every Ray worker (trainer ranks, inference
servers) when it loads the config, so a worker's DEBUG lines reach its own log stream.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["enable_debug_logging"]

_HANDLER_NAME = "telescope-debug"


def enable_debug_logging() -> None:
    """Set the ``telescope`` logger to DEBUG with one stderr handler (idempotent)."""
    root = logging.getLogger("telescope")
    root.setLevel(logging.DEBUG)
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d %(message)s")
    )
    root.addHandler(handler)
