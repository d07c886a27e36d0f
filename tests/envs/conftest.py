"""Fixtures of the environment tests: a tiny local tokenizer and the installed registry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from envs_tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def registry() -> Any:
    from telescope.core.plugins import load_plugins

    return load_plugins()[1]
