"""Fixtures of the inference tests: a private model cache and in-process servers on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TELESCOPE_CACHE_DIR pointed at a fresh folder (subprocesses inherit it)."""
    path = str(tmp_path_factory.mktemp("telescope-cache"))
    old = os.environ.get("TELESCOPE_CACHE_DIR")
    os.environ["TELESCOPE_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("TELESCOPE_CACHE_DIR", None)
    else:
        os.environ["TELESCOPE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_path(model_cache: str) -> str:
    """Folder of the built-in tiny model, built once per session."""
    from telescope.core.models import resolve_model_path

    return resolve_model_path("telescope/tiny")


def make_cfg(**overrides: object):  # type: ignore[no-untyped-def]
    """A run config for the tiny model; one torch thread keeps the 2-core CI machine responsive."""
    from telescope.core.testing import make_config

    base = {"model": "telescope/tiny", "max_model_len": 512, "ray_inference_cpus_per_worker": 1.0, "seed": 7}
    return make_config(**{**base, **overrides})
