"""Make the shared fakes of this folder importable (pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The built-in tiny model's tokenizer (orchestrator tests with scripted servers)."""
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny"))
