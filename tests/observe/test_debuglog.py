"""The ``debug`` config field turns on DEBUG logging in the process that loads the config (a Ray
worker does it in ``workers._load``; the driver in ``telescope train``)."""

from __future__ import annotations

import logging

import pytest

from telescope.core.runtime.workers import _load
from telescope.core.testing import make_config


@pytest.fixture
def telescope_logger():
    root = logging.getLogger("telescope")
    level, handlers = root.level, list(root.handlers)
    yield root
    root.setLevel(level)
    root.handlers[:] = handlers


def test_worker_with_debug_logs_debug_lines(telescope_logger, capfd) -> None:
    _load(make_config(debug=False).to_dict(), [])
    logging.getLogger("telescope.runtime.test").debug("hidden line")
    assert "hidden line" not in capfd.readouterr().err
    _load(make_config(debug=True).to_dict(), [])
    _load(make_config(debug=True).to_dict(), [])  # idempotent: one handler
    logging.getLogger("telescope.runtime.test").debug("visible line")
    err = capfd.readouterr().err
    assert err.count("visible line") == 1 and "DEBUG telescope.runtime.test" in err
