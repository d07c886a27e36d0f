"""Megatron test fixtures; helpers live in megatron_helpers.py (also imported by spawned workers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

# --import-mode=importlib keeps test folders off sys.path; spawned workers inherit sys.path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_models():  # type: ignore[no-untyped-def]
    from megatron_helpers import build_tiny_hf

    cache: dict[str, object] = {}

    def get(kind: str):  # type: ignore[no-untyped-def]
        if kind not in cache:
            cache[kind] = build_tiny_hf(kind)
        return cache[kind]

    return get
