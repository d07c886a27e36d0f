"""Checkpoint test fixtures: tiny model folders and a one-rank gloo group torn down afterwards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib keeps test folders off sys.path: reuse the FSDP helpers and ours
# (spawned worker processes inherit sys.path).
sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer random Qwen2 with separate input/output embeddings and no tokenizer."""
    from fsdp_helpers import save_tiny_qwen2

    return save_tiny_qwen2(Path(tmp_path_factory.mktemp("untied_qwen2")), tied=False, seed=3)


@pytest.fixture(scope="module")
def builtin_tiny_dir() -> str:
    """The built-in ``telescope/tiny`` (tied embeddings, tokenizer, chat template)."""
    from telescope.core.models.tiny import resolve_model_path

    return resolve_model_path("telescope/tiny")


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """Backends of one module share one in-process gloo group; destroyed at module end."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
