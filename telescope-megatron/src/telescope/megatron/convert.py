"""Megatron checkpoint -> HF weight files (registered as the ``megatron`` backend's ``checkpoint_converter``).

The HF weights saved beside each checkpoint (``hf/``, option ``checkpoint_hf_weights``) are
copied; converting dist_checkpointing shards without them is not implemented.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["write_hf_weights"]


def write_hf_weights(src: Path, out: Path, limit: int) -> None:
    """Copy ``src/hf`` into ``out`` (``limit`` is unused: the files were sharded when saved)."""
    hf = src / "hf"
    if not (hf / "model.safetensors.index.json").is_file() and not (hf / "model.safetensors").is_file():
        raise NotImplementedError(
            f"converting a Megatron dist_checkpointing checkpoint ({src}) without its hf/ weights; "
            "train with the megatron option checkpoint_hf_weights: true so each checkpoint carries HF weights"
        )
    for file in hf.iterdir():
        if file.is_file():
            shutil.copy2(file, out / file.name)
