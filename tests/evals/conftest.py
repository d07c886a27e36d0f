"""Fixtures of the eval tests: the tiny model, a registry with a deterministic eval environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tokenizer(tiny_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def registry() -> Any:
    """Core built-ins plus the eval test environments (entry points not loaded)."""
    import eval_envs

    from telescope.core.testing import registry_with

    return registry_with(("eval-test-envs", eval_envs))[1]
