"""FSDP checkpoint -> HF weight files (registered as the ``fsdp`` backend's ``checkpoint_converter``).

Only the ``model.*`` tensors of the DCP files are read, one output shard at a time (memory
stays near one shard), without a process group (``no_dist``). Names are already HF names;
dtypes are kept. When the config ties the input and output embeddings ``lm_head.weight`` is
dropped (safetensors refuses shared storage and ``from_pretrained`` re-ties it). The generic
steps (shard files and index, atomic output, hf_meta, config dtype) are
``telescope.core.checkpoint.convert``'s.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from telescope.core.checkpoint.convert import ConversionError, write_safetensors_shards
from telescope.core.checkpoint.layout import HF_META_DIR

__all__ = ["model_tensor_specs", "write_hf_weights"]


def _ties_embeddings(hf_meta: Path) -> bool:
    """Whether the model config ties input and output embeddings (transformers' own default)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(hf_meta))
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return bool(getattr(text, "tie_word_embeddings", False))
    except (OSError, ValueError, KeyError):
        raw = json.loads((hf_meta / "config.json").read_text()) if (hf_meta / "config.json").is_file() else {}
        return bool(raw.get("tie_word_embeddings", False))


def model_tensor_specs(src: Path) -> list[tuple[str, str, Any]]:
    """``(hf_name, dcp_key, TensorStorageMetadata)`` for each model tensor in the DCP files."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(src)).read_metadata()
    specs = []
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            specs.append((key[len("model.") :], key, md))
    if not specs:
        raise ConversionError(
            f"{src} holds no model tensors in its DCP files; is it a complete FSDP checkpoint?"
        )
    return specs


def write_hf_weights(src: Path, out: Path, limit: int) -> None:
    """Write ``src``'s model tensors as safetensors shards of at most ``limit`` bytes into ``out``."""
    specs = model_tensor_specs(src)
    if _ties_embeddings(src / HF_META_DIR) and any(name != "lm_head.weight" for name, _, _ in specs):
        specs = [s for s in specs if s[0] != "lm_head.weight"]
    by_name = {name: (key, md) for name, key, md in specs}
    nbytes = [(name, md.size.numel() * _itemsize(md.properties.dtype)) for name, (_, md) in by_name.items()]
    write_safetensors_shards(out, nbytes, limit, lambda names: _read_tensors(src, by_name, names))


def _read_tensors(src: Path, by_name: dict[str, tuple[str, Any]], names: list[str]) -> dict[str, Any]:
    """``{hf name: tensor}`` of ``names``, read from the DCP files without a process group."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    flat = {
        by_name[n][0]: torch.empty(tuple(by_name[n][1].size), dtype=by_name[n][1].properties.dtype)
        for n in names
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load(flat, storage_reader=FileSystemReader(str(src)), no_dist=True)
    return {n: flat[by_name[n][0]] for n in names}


def _itemsize(dtype: Any) -> int:
    import torch

    return int(torch.empty((), dtype=dtype).element_size())
