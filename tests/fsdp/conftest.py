"""FSDP test fixtures: a tiny model folder and a one-rank process group torn down afterwards."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib keeps test folders off sys.path; the helpers (also imported by
# spawned worker processes, which inherit sys.path) live next to this file.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fsdp_helpers import save_tiny_qwen2

    return save_tiny_qwen2(Path(tmp_path_factory.mktemp("tiny_qwen2")))


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """Backends of one module share one in-process gloo group; destroyed at module end."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
